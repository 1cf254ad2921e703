package rankmap

import (
	"errors"
	"testing"
)

// TestRefusalsNameSideBufferAndNumbers pins the wording of a few refusals: an operator reading
// the REGISTER log must see which side, which buffer and which numbers do not map.
func TestRefusalsNameSideBufferAndNumbers(t *testing.T) {
	withBuf := func(t Topology, f func(*Buffer)) Topology {
		t = clone(t)
		f(&t.Buffers[1])
		return t
	}
	for _, tc := range []struct {
		name            string
		prefill, decode Topology
		want            error
		msg             string
	}{
		{"page size", mhaSide(2, 8), withBuf(mhaSide(4, 8), func(b *Buffer) { b.PageTokens = 16 }), ErrPageSizeMismatch,
			"rankmap: page size mismatch: buffer 1 prefill 4 tokens, decode 16"},
		{"dtype", mhaSide(2, 8), withBuf(mhaSide(4, 8), func(b *Buffer) { b.HeadBytes = 128 }), ErrDtypeMismatch,
			"rankmap: bytes per head mismatch: buffer 1 prefill 256 bytes, decode 128"},
		{"heads", mhaSide(4, 8), withBuf(mhaSide(2, 8), func(b *Buffer) { b.TotalHeads, b.RankHeads = 6, 3 }), ErrHeadCountMismatch,
			"rankmap: total kv head count mismatch: buffer 1 prefill 8, decode 6"},
		{"heads do not divide", mhaSide(2, 8), withBuf(mhaSide(4, 8), func(b *Buffer) { b.TotalHeads, b.RankHeads = 6, 1 }), ErrHeadsNotDivisible,
			"rankmap: kv heads and tp size do not divide: decode buffer 1 has 6 kv heads over tp 4"},
		{"heads per rank", withBuf(mhaSide(2, 8), func(b *Buffer) { b.RankHeads = 8 }), mhaSide(2, 8), ErrRankHeadsMismatch,
			"rankmap: kv heads per rank do not match total and tp: prefill buffer 1 holds 8 heads per rank, 8 heads over tp 2 give 4"},
		{"mixed", mhaSide(2, 8), mlaSide(2), ErrMixedAttention, "rankmap: mla on one side only: prefill mha, decode mla"},
		{"tp", mhaSide(2, 8), mlaSide(0), ErrInvalidTP, "rankmap: invalid tp size: decode tp 0, want 1..64"},
		{"tp ratio", mlaSide(2), mlaSide(3), ErrTPNotDivisible, "rankmap: tp sizes do not divide: prefill tp 2, decode tp 3"},
	} {
		_, err := Plan(tc.prefill, tc.decode)
		if !errors.Is(err, tc.want) || err.Error() != tc.msg {
			t.Errorf("%s: err %q, want %q wrapping %v", tc.name, err, tc.msg, tc.want)
		}
	}
}
