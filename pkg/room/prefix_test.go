package room

import (
	"testing"
	"time"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
)

// openWithPrefix opens room on both sides and sends decode's metadata for
// 4 pages of which decode holds the first prefix; it returns the key.
func (h *harness) openWithPrefix(room poll.RoomID, prefix uint32) poll.Key {
	h.t.Helper()
	if _, err := h.pre.Open(room, 0, 0); err != nil {
		h.t.Fatalf("prefill open %d: %v", room, err)
	}
	nonce, err := h.dec.Open(room, prefillAddr, 1)
	if err != nil {
		h.t.Fatalf("decode open %d: %v", room, err)
	}
	if err := h.dec.SendMetadata(room, MetadataRequest{Rank: Rank{Size: 1}, DstPages: &pdlinkv1.PageList{Indices: []int32{1, 2, 3, 4}},
		AuxIndex: 4, PrefixLen: prefix}); err != nil {
		h.t.Fatalf("send metadata %d: %v", room, err)
	}
	return poll.Key{Room: room, Nonce: nonce}
}

func statusOf(n interface {
	PollStatus([]poll.RoomID, []Status) []Status
}, room poll.RoomID) Status {
	return n.PollStatus([]poll.RoomID{room}, nil)[0]
}

// prefixEntries is how many rooms' prefixes the owner keeps.
func prefixEntries(c *core) (n int) {
	c.exec(func() { c.withTable(func() { n = len(c.prefixes) }) })
	return n
}

// The prefill scheduler learns decode's prefix with the room's move to
// WaitingForInput: the transition that move publishes carries it, and so
// does every Poll from then on, so a scheduler that polls or watches knows
// it before its first Send. Decode's own status carries none. A room
// without a prefix shows 0 and costs no entry.
func TestPrefillStatusCarriesDecodesPrefixFromWaitingForInput(t *testing.T) {
	h := newHarness(t, 31)
	sub := h.pre.Subscribe(64)
	defer sub.Close()
	key := h.openWithPrefix(1, 3)
	plain := h.openWithPrefix(2, 0)
	if !h.waitBound(key, time.Second) || !h.waitBound(plain, time.Second) {
		t.Fatal("rooms not bound")
	}
	got := map[poll.RoomID]uint32{}
	for len(got) < 2 {
		select {
		case tr := <-sub.C():
			if tr.To == poll.WaitingForInput {
				got[tr.Key.Room] = tr.PrefixLen
			}
		default:
			t.Fatalf("WaitingForInput transitions seen: %v, want rooms 1 and 2", got)
		}
	}
	if got[1] != 3 || got[2] != 0 {
		t.Fatalf("WaitingForInput transitions carry prefixes %v, want room 1: 3, room 2: 0", got)
	}
	if st := statusOf(h.pre, 1); st.State != poll.WaitingForInput || st.Nonce != key.Nonce || st.PrefixLen != 3 {
		t.Fatalf("prefill Poll of room 1: %+v, want WaitingForInput, nonce %d, prefix 3", st, key.Nonce)
	}
	if st := statusOf(h.pre, 2); st.PrefixLen != 0 {
		t.Fatalf("prefill Poll of room 2: prefix %d, want 0", st.PrefixLen)
	}
	if st := statusOf(h.dec, 1); st.PrefixLen != 0 {
		t.Fatalf("decode Poll of room 1: prefix %d, want 0 (prefill's field)", st.PrefixLen)
	}
	if n := prefixEntries(h.pre.core); n != 1 {
		t.Fatalf("prefill keeps %d prefixes, want 1 (room 2 has none)", n)
	}
	h.transfer(key, 1)
	if _, ok := h.until(time.Second, func() bool { return h.preState(1) == poll.Success }); !ok {
		t.Fatalf("room 1: prefill %v, want Success", h.preState(1))
	}
	if st := statusOf(h.pre, 1); st.PrefixLen != 3 {
		t.Fatalf("prefill Poll of room 1 after Success: prefix %d, want 3", st.PrefixLen)
	}
}

// The prefix goes with the room, in the critical section that removes it
// (I6): cleared or reaped, no entry is left, and a later room with the
// same id starts without one. A METADATA about a room prefill does not
// hold keeps nothing (I3).
func TestPrefixLeavesWithItsRoom_I3_I6(t *testing.T) {
	h := newHarness(t, 32)
	cleared, reaped := h.openWithPrefix(1, 2), h.openWithPrefix(2, 2)
	for _, k := range []poll.Key{cleared, reaped} {
		if !h.waitBound(k, time.Second) {
			t.Fatalf("room %d not bound", k.Room)
		}
		h.transfer(k, 1)
	}
	if _, ok := h.until(time.Second, func() bool { return h.bothTerminal(1, 2) }); !ok {
		t.Fatal("rooms not terminal")
	}
	if n := prefixEntries(h.pre.core); n != 2 {
		t.Fatalf("prefill keeps %d prefixes, want 2", n)
	}
	errs := make([]error, 1)
	h.pre.Clear([]poll.RoomID{1}, errs)
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	if n := prefixEntries(h.pre.core); n != 1 {
		t.Fatalf("after Clear prefill keeps %d prefixes, want 1", n)
	}
	h.advance(tLinger + 2*tTick) // room 2 is never cleared: reaped
	if n := prefixEntries(h.pre.core); n != 0 {
		t.Fatalf("after the reaper prefill keeps %d prefixes, want 0", n)
	}
	again := h.openWithPrefix(1, 0)
	if !h.waitBound(again, time.Second) {
		t.Fatal("room 1 again not bound")
	}
	if st := statusOf(h.pre, 1); st.PrefixLen != 0 {
		t.Fatalf("room 1 again shows prefix %d, want 0 (the old room's went with it)", st.PrefixLen)
	}

	// Decode opens a room prefill never opened: its METADATA creates
	// nothing there, no prefix either.
	if _, err := h.dec.Open(9, prefillAddr, 1); err != nil {
		t.Fatal(err)
	}
	if err := h.dec.SendMetadata(9, MetadataRequest{Rank: Rank{Size: 1}, DstPages: &pdlinkv1.PageList{Indices: []int32{1, 2}}, PrefixLen: 1}); err != nil {
		t.Fatal(err)
	}
	h.advance(5 * tTick)
	if st := statusOf(h.pre, 9); st.State != poll.StateNone {
		t.Fatalf("prefill holds room 9: %+v", st)
	}
	if n := prefixEntries(h.pre.core); n != 0 {
		t.Fatalf("a METADATA for an unknown room left %d prefixes", n)
	}
	h.checkInvariants()
}
