package transfer

import (
	"reflect"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// A key logs as fields of the line: the room id as a number (never the
// "room/nonce rank tp/size" string), nonce, rank and from_rank apart.
func TestKeyLogsRoomAsItsIDWithNonceAndRanksApart(t *testing.T) {
	for _, tc := range []struct {
		key  Key
		want map[string]any
	}{
		{Key{Room: 7, Nonce: 42}, map[string]any{"room": uint64(7), "nonce": uint64(42)}},
		{Key{Room: 7, Nonce: 42, Rank: Rank{TP: 0, Size: 1}}, map[string]any{"room": uint64(7), "nonce": uint64(42), "rank": "0/1"}},
		{Key{Room: 7, Nonce: 42, Rank: Rank{TP: 1, Size: 2}, From: Rank{TP: 3, Size: 4}},
			map[string]any{"room": uint64(7), "nonce": uint64(42), "rank": "1/2", "from_rank": "3/4"}},
	} {
		enc := zapcore.NewMapObjectEncoder()
		zap.Inline(tc.key).AddTo(enc)
		if !reflect.DeepEqual(enc.Fields, tc.want) {
			t.Errorf("%v logs %v, want %v", tc.key, enc.Fields, tc.want)
		}
	}
}

// wantKeyFields fails t unless a line about a room (fields f) names it as Key logs it: the
// room id and the nonce as numbers, so a query for the room finds the line.
func wantKeyFields(t *testing.T, f map[string]any) {
	t.Helper()
	_, room := f["room"].(uint64)
	_, nonce := f["nonce"].(uint64)
	if !room || !nonce {
		t.Fatalf("line names room %T %v, nonce %T %v; want both numbers (fields %v)", f["room"], f["room"], f["nonce"], f["nonce"], f)
	}
}
