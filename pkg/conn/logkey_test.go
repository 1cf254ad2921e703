package conn

import (
	"reflect"
	"testing"

	"go.uber.org/zap/zapcore"

	"github.com/pdlink/pdlink/pkg/poll"
)

// RoomField logs the room id as a number and the nonce beside it once
// known (a prefill room has none before decode's METADATA).
func TestRoomFieldLogsTheIDAsANumberAndTheNonceOnceKnown(t *testing.T) {
	for _, tc := range []struct {
		key  poll.Key
		want map[string]any
	}{
		{poll.Key{Room: 7, Nonce: 42}, map[string]any{"room": uint64(7), "nonce": uint64(42)}},
		{poll.Key{Room: 7}, map[string]any{"room": uint64(7)}},
	} {
		enc := zapcore.NewMapObjectEncoder()
		RoomField(tc.key).AddTo(enc)
		if !reflect.DeepEqual(enc.Fields, tc.want) {
			t.Errorf("%v logs %v, want %v", tc.key, enc.Fields, tc.want)
		}
	}
}
