package conn

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/poll"
)

// delivery is one room frame the decode link handed to the node.
type delivery struct {
	peer poll.PeerID
	seq  uint64
	ft   FrameType
}

// TestLinkDeliversFramesInOrderPerPeer: the decode link hands a prefill's
// room frames to the room side one at a time, in the order its session
// read them (prefill draws increasing seqs, and the network here neither
// drops nor reorders), each exactly once.
func TestLinkDeliversFramesInOrderPerPeer(t *testing.T) {
	var mu sync.Mutex
	var got []delivery
	h := newHarnessWith(t, 41, options{dec: func(c *DecodeConfig) {
		c.roomFrameHook = func(peer poll.PeerID, seq uint64, ft FrameType) {
			mu.Lock()
			got = append(got, delivery{peer, seq, ft})
			mu.Unlock()
		}
	}})
	const rooms = 64
	for r := poll.RoomID(1); r <= rooms; r++ {
		h.open(r, 1)
	}
	if _, ok := h.until(tBound, func() bool {
		for r := poll.RoomID(1); r <= rooms; r++ {
			if h.preState(r) != poll.WaitingForInput {
				return false
			}
		}
		return true
	}); !ok {
		t.Fatal("rooms not bound on prefill")
	}
	for r := poll.RoomID(1); r <= rooms; r++ {
		if err := h.pre.Abort(context.Background(), r, ""); err != nil {
			t.Fatalf("abort %d: %v", r, err)
		}
	}
	if _, ok := h.until(tBound, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) >= rooms
	}); !ok {
		t.Fatalf("decode's room side got %d of %d aborts", len(got), rooms)
	}
	mu.Lock()
	defer mu.Unlock()
	last := map[poll.PeerID]uint64{}
	for i, d := range got {
		if d.ft != FrameAbort {
			t.Fatalf("delivery %d is %v, want only ABORTs", i, d.ft)
		}
		if d.seq <= last[d.peer] {
			t.Fatalf("delivery %d from peer %d has seq %d after seq %d: out of order or repeated (all: %v)", i, d.peer, d.seq, last[d.peer], got)
		}
		last[d.peer] = d.seq
	}
}

// TestLinkKeepsPeersUpWhileTheRoomSideBlocks is the direct-call form of
// "nobody reading events": decode's room side is stuck inside the delivery
// of one frame (its session's reader waits with it), and the link's own
// work goes on: heartbeats leave every interval, so prefill keeps counting
// decode up for many heartbeat bounds and loses nobody. (Decode cannot hear
// that prefill until the delivery returns: the bounded event queue of PLAN
// step 3 is what lifts that.)
func TestLinkKeepsPeersUpWhileTheRoomSideBlocks(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan struct{}, 1)
	h := newHarnessWith(t, 43, options{dec: func(c *DecodeConfig) {
		c.roomFrameHook = func(_ poll.PeerID, _ uint64, ft FrameType) {
			if ft == FrameAbort {
				select {
				case entered <- struct{}{}:
				default:
				}
				<-release
			}
		}
	}})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock) // runs before the harness closes the nodes
	h.open(1, 1)
	if _, ok := h.until(tBound, func() bool { return h.preState(1) == poll.WaitingForInput }); !ok {
		t.Fatal("room not bound on prefill")
	}
	if err := h.pre.Abort(context.Background(), 1, ""); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the ABORT never reached decode's room side")
	}
	beats := func() uint64 { return h.pre.Counters().Frames(FrameHeartbeat, Received) }
	bound := time.Duration(tMisses) * tHeartbeat
	for el := time.Duration(0); el < 10*bound; el += tHeartbeat {
		before := beats()
		// Advance returns once the tick worker handled each tick; a tick
		// worker stuck behind the blocked delivery never does.
		advanced := make(chan struct{})
		go func() {
			defer close(advanced)
			for d := time.Duration(0); d < tHeartbeat; d += tTick {
				h.clk.Advance(tTick)
			}
		}()
		select {
		case <-advanced:
		case <-time.After(10 * time.Second):
			unblock()
			<-advanced
			t.Fatalf("decode's tick worker stopped while the room side was blocked (%v in)", el)
		}
		if !h.waitReal(10*time.Second, func() bool { return beats() > before }) {
			t.Fatalf("no heartbeat from decode reached prefill in the heartbeat interval %v in", el)
		}
	}
	up := false
	for _, p := range h.pre.Peers() {
		up = up || p.Up
	}
	if !up {
		t.Fatalf("prefill counts decode down after %v with decode's room side blocked: %+v", 10*bound, h.pre.Peers())
	}
	if c := h.pre.Counters(); c.PeersLost != 0 {
		t.Fatalf("prefill lost %d peers while decode's room side was blocked", c.PeersLost)
	}
	unblock()
	if _, ok := h.until(tBound, func() bool { return h.decState(1) == poll.Failed }); !ok {
		t.Fatalf("decode room 1 is %v after the delivery returned, want Failed", h.decState(1))
	}
}
