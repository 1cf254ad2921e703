package room

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

// delivery is one room frame a link handed to its room side.
type delivery struct {
	peer poll.PeerID
	seq  uint64
	ft   conn.FrameType
}

type roomFrameHook = func(peer poll.PeerID, seq uint64, ft conn.FrameType)

// hookOn installs hook on one side's room seam.
func hookOn(side poll.Side, hook roomFrameHook) options {
	if side == poll.Prefill {
		return options{pre: func(c *PrefillConfig) { c.roomFrameHook = hook }}
	}
	return options{dec: func(c *DecodeConfig) { c.roomFrameHook = hook }}
}

// TestLinkDeliversFramesInOrderPerPeer: each link hands its peer's room
// frames to the room side one at a time, in the order its reader got them
// (the sender draws increasing seqs, and the network here neither drops
// nor reorders), each once. Decode's room side gets prefill's ABORTs,
// prefill's gets decode's METADATA.
func TestLinkDeliversFramesInOrderPerPeer(t *testing.T) {
	for _, side := range []poll.Side{poll.Decode, poll.Prefill} {
		t.Run(side.String(), func(t *testing.T) {
			var mu sync.Mutex
			var got []delivery
			h := newHarnessWith(t, 41, hookOn(side, func(peer poll.PeerID, seq uint64, ft conn.FrameType) {
				mu.Lock()
				got = append(got, delivery{peer, seq, ft})
				mu.Unlock()
			}))
			const rooms = 64
			want := conn.FrameMetadata
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
			if side == poll.Decode {
				want = conn.FrameAbort
				for r := poll.RoomID(1); r <= rooms; r++ {
					if err := h.pre.Abort(context.Background(), r, ""); err != nil {
						t.Fatalf("abort %d: %v", r, err)
					}
				}
			}
			if _, ok := h.until(tBound, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(got) >= rooms
			}); !ok {
				t.Fatalf("%v's room side got %d of %d frames", side, len(got), rooms)
			}
			mu.Lock()
			defer mu.Unlock()
			last := map[poll.PeerID]uint64{}
			for i, d := range got {
				if d.ft != want {
					t.Fatalf("delivery %d is %v, want only %v", i, d.ft, want)
				}
				if d.seq <= last[d.peer] {
					t.Fatalf("delivery %d from peer %d has seq %d after seq %d: out of order or repeated (all: %v)", i, d.peer, d.seq, last[d.peer], got)
				}
				last[d.peer] = d.seq
			}
		})
	}
}

// TestLinkKeepsPeersUpWhileTheRoomSideBlocks: one side's owner is stuck
// inside the step of a frame (roomFrameHook runs on the owner), and that
// side's link work goes on: heartbeats leave every interval, so the other
// side keeps counting it up for many heartbeat bounds and loses nobody.
// (That the blocked side keeps hearing its peer, and answers every frame
// once released, is TestHeldOwnerKeepsItsPeerUpAndAnswersEveryFrameOnceInOrder.)
func TestLinkKeepsPeersUpWhileTheRoomSideBlocks(t *testing.T) {
	for _, side := range []poll.Side{poll.Decode, poll.Prefill} {
		t.Run(side.String(), func(t *testing.T) {
			block := conn.FrameAbort
			if side == poll.Prefill {
				block = conn.FrameMetadata
			}
			release := make(chan struct{})
			entered := make(chan struct{}, 1)
			h := newHarnessWith(t, 43, hookOn(side, func(_ poll.PeerID, _ uint64, ft conn.FrameType) {
				if ft == block {
					select {
					case entered <- struct{}{}:
					default:
					}
					<-release
				}
			}))
			var once sync.Once
			unblock := func() { once.Do(func() { close(release) }) }
			t.Cleanup(unblock) // runs before the harness closes the nodes
			h.open(1, 1)
			if side == poll.Decode {
				if _, ok := h.until(tBound, func() bool { return h.preState(1) == poll.WaitingForInput }); !ok {
					t.Fatal("room not bound on prefill")
				}
				if err := h.pre.Abort(context.Background(), 1, ""); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case <-entered:
			case <-time.After(10 * time.Second):
				t.Fatalf("no %v reached %v's room side", block, side)
			}
			type observer interface {
				Counters() conn.Counters
				Peers() []conn.PeerInfo
			}
			var other observer = h.pre
			if side == poll.Prefill {
				other = h.dec
			}
			beats := func() uint64 { return other.Counters().Frames(conn.FrameHeartbeat, conn.Received) }
			bound := time.Duration(tMisses) * tHeartbeat
			for el := time.Duration(0); el < 10*bound; el += tHeartbeat {
				before := beats()
				// Advance returns once the tick worker handled each tick; a
				// tick worker stuck behind the blocked delivery never does.
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
					t.Fatalf("%v's tick worker stopped while its room side was blocked (%v in)", side, el)
				}
				if !h.waitReal(10*time.Second, func() bool { return beats() > before }) {
					t.Fatalf("no heartbeat from %v arrived in the heartbeat interval %v in", side, el)
				}
			}
			up := false
			for _, p := range other.Peers() {
				up = up || p.Up
			}
			if !up {
				t.Fatalf("%v counted down after %v with its room side blocked: %+v", side, 10*bound, other.Peers())
			}
			if c := other.Counters(); c.PeersLost != 0 {
				t.Fatalf("%d peers lost while %v's room side was blocked", c.PeersLost, side)
			}
			unblock()
			done := func() bool { return h.decState(1) == poll.Failed }
			if side == poll.Prefill {
				done = func() bool { return h.preState(1) != poll.Bootstrapping }
			}
			if _, ok := h.until(tBound, done); !ok {
				t.Fatalf("room 1 did not move on after the delivery returned (prefill %v, decode %v)", h.preState(1), h.decState(1))
			}
		})
	}
}
