package room

import (
	"testing"

	"github.com/pdlink/pdlink/pkg/transfer"
)

// A room of several ranks is fenced (I9: its Failed may show, its pages
// be reused) only once every rank's share let go, in whatever order the
// data plane reports them; a fence whose ranks are all idle is done at
// once and reports nothing later; a room of one rank goes straight to the
// node, as before ranks.
func TestRoomIsFencedOnlyOnceEveryRankLetGo(t *testing.T) {
	keys := func(n uint16) []transfer.Key {
		out := make([]transfer.Key, n)
		for i := range out {
			out[i] = transfer.Key{Room: 1, Nonce: 2, Rank: transfer.Rank{TP: uint16(i), Size: n}}
		}
		return out
	}
	var f rankFences
	busy := map[transfer.Key]bool{}
	fence := func(k transfer.Key) bool { return !busy[k] }
	fenced := 0
	ks := keys(3)
	busy[ks[0]], busy[ks[2]] = true, true
	if f.fence(ks, fence, func() { fenced++ }) {
		t.Fatal("fence done while ranks 0 and 2 still write")
	}
	f.onFenced(ks[2], func() { t.Fatal("a rank of 3 reported as a room of one") })
	if fenced != 0 {
		t.Fatal("room fenced while rank 0 still writes")
	}
	f.onFenced(ks[0], func() { t.Fatal("a rank of 3 reported as a room of one") })
	if fenced != 1 {
		t.Fatalf("room fenced %d times once every rank let go, want 1", fenced)
	}
	f.onFenced(ks[0], func() {}) // a late repeat changes nothing
	if fenced != 1 || len(f.pending) != 0 {
		t.Fatalf("fenced %d, %d keys still pending", fenced, len(f.pending))
	}

	clear(busy)
	if !f.fence(ks, fence, func() { t.Fatal("an idle room reported fenced later") }) {
		t.Fatal("fence of idle ranks not done")
	}
	if len(f.pending) != 0 {
		t.Fatalf("%d keys pending after a done fence", len(f.pending))
	}

	one := keys(1)
	busy[one[0]] = true
	if f.fence(one, fence, func() { t.Fatal("a room of one rank is the node's to report") }) {
		t.Fatal("fence of a busy rank 0 of 1 done")
	}
	single := 0
	f.onFenced(one[0], func() { single++ })
	if single != 1 {
		t.Fatalf("room of one rank: node told %d times, want 1", single)
	}
}
