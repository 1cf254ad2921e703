package poll

import (
	"testing"
	"time"
)

// terminal returns the room's one EffTransition to a terminal state.
func (h *harness) terminal(id RoomID) Effect {
	h.t.Helper()
	var out []Effect
	for _, e := range h.effects {
		if e.Kind == EffTransition && e.Key.Room == id && e.To.Terminal() {
			out = append(out, e)
		}
	}
	if len(out) != 1 {
		h.t.Fatalf("room %d: %d terminal transitions, want 1:\n%s", id, len(out), formatEffects(h.effects))
	}
	return out[0]
}

// A room's move to a terminal state says when it was opened and when it
// entered the state it leaves: for Success that is its first KV byte,
// not its last progress (the duration histograms read them, pkg/room).
func TestTerminalTransitionCarriesOpenAndFirstByteTimes(t *testing.T) {
	h := newHarness(t, Prefill)
	h.now = at(3 * time.Second)
	h.must(open(1, 0, NoPeer))
	h.now += at(time.Second)
	h.must(ev(EvMetadata, 1, 42, testPeer))
	h.now += at(time.Second)
	h.must(local(EvFirstChunk, 1)) // transfer begins at 5s
	for range 3 {
		h.now += at(time.Second)
		h.must(local(EvProgress, 1)) // refreshes the idle deadline, not the state
	}
	h.now += at(time.Second)
	h.must(ev(EvDone, 1, 42, testPeer)) // Success at 9s
	if e := h.terminal(1); e.To != Success || e.Opened != at(3*time.Second) || e.Entered != at(5*time.Second) || e.At != at(9*time.Second) {
		t.Fatalf("Success %s opened=%v entered=%v at=%v, want opened 3s, entered 5s, at 9s",
			formatEffect(e), time.Duration(e.Opened), time.Duration(e.Entered), time.Duration(e.At))
	}

	// Failed, by a timeout and born Failed from an early abort.
	h.now = at(20 * time.Second)
	h.must(open(2, 0, NoPeer))
	h.advance(bootT)
	if e := h.terminal(2); e.To != Failed || e.Opened != at(20*time.Second) || e.Entered != e.Opened || e.At-e.Opened != int64(bootT) {
		t.Fatalf("timeout %s opened=%v entered=%v at=%v, want a life of the bootstrap timeout",
			formatEffect(e), time.Duration(e.Opened), time.Duration(e.Entered), time.Duration(e.At))
	}
	h.must(Event{Kind: EvAbortRemote, Key: Key{3, 9}, Peer: testPeer})
	h.must(open(3, 9, testPeer))
	if e := h.terminal(3); e.To != Failed || e.From != StateNone || e.Opened != h.now || e.At != h.now {
		t.Fatalf("born Failed %s opened=%v at=%v, want both now (%v)", formatEffect(e), time.Duration(e.Opened), time.Duration(e.At), time.Duration(h.now))
	}
}
