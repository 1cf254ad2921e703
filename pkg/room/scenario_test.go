package room

import (
	"context"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

func TestHappyPathReachesSuccessOnBothSides(t *testing.T) {
	h := newHarness(t, 1)
	sub := h.dec.Subscribe(16)
	defer sub.Close()
	key := h.open(1, 1)
	if !h.waitBound(key, time.Second) {
		t.Fatalf("prefill never bound the room: pre %v dec %v", h.preState(1), h.decState(1))
	}
	if got := h.decState(1); got != poll.WaitingForInput {
		t.Fatalf("decode %v after metadata ack, want WaitingForInput", got)
	}
	h.transfer(key, 1)
	if _, ok := h.until(time.Second, func() bool { return h.bothTerminal(1) }); !ok {
		t.Fatalf("not terminal: pre %v dec %v", h.preState(1), h.decState(1))
	}
	h.expect(1, poll.Success, poll.Success)
	var tos []poll.State
	for len(sub.C()) > 0 {
		tos = append(tos, (<-sub.C()).To)
	}
	want := []poll.State{poll.Bootstrapping, poll.WaitingForInput, poll.Transferring, poll.Success}
	if len(tos) != len(want) {
		t.Fatalf("decode transitions %v, want %v", tos, want)
	}
	c := h.pre.Counters()
	if c.Frames(conn.FrameMetadata, conn.Received) != 1 || c.Frames(conn.FrameStatus, conn.Received) != 1 || c.RejectedTotal() != 0 {
		t.Fatalf("prefill counters: metadata %d status %d rejected %d", c.Frames(conn.FrameMetadata, conn.Received), c.Frames(conn.FrameStatus, conn.Received), c.RejectedTotal())
	}
	h.checkInvariants()
}

// runToEnd drives a room through the data plane once prefill binds it and
// waits until both sides are terminal; it fails the test past tBound.
func (h *harness) runToEnd(key poll.Key, ranks int) {
	h.t.Helper()
	if h.waitBound(key, tBound) {
		h.transfer(key, ranks)
	}
	if _, ok := h.until(tBound, func() bool { return h.bothTerminal(key.Room) }); !ok {
		h.t.Fatalf("room %d pinned: prefill %v decode %v", key.Room, h.preState(key.Room), h.decState(key.Room))
	}
}

// Every frame type lost once: the room still ends, correctly, within its
// bound, because every state-changing frame is retransmitted until
// acknowledged and heartbeats tolerate misses.
func TestEachFrameTypeDroppedOnceStillEndsCorrectly(t *testing.T) {
	success := []struct {
		name     string
		from, to string
		ft       conn.FrameType
	}{
		{"register", decodeHost, prefillHost, conn.FrameRegister},
		{"metadata", decodeHost, prefillHost, conn.FrameMetadata},
		{"ack_to_decode", prefillHost, decodeHost, conn.FrameAck},
		{"status", decodeHost, prefillHost, conn.FrameStatus},
		{"heartbeat_to_prefill", decodeHost, prefillHost, conn.FrameHeartbeat},
		{"heartbeat_to_decode", prefillHost, decodeHost, conn.FrameHeartbeat},
	}
	for _, tc := range success {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 2)
			h.net.DropNext(tc.from, tc.to, 1, isFrame(tc.ft))
			key := h.open(1, 1)
			h.runToEnd(key, 1)
			h.advance(2 * tHeartbeat) // long enough for heartbeats to flow
			h.expect(1, poll.Success, poll.Success)
			if c := h.pre.Counters(); c.PeersLost != 0 || h.dec.Counters().PeersLost != 0 {
				t.Fatal("one lost heartbeat declared a peer lost")
			}
			if h.net.Dropped() == 0 {
				t.Fatalf("no %s frame was dropped", tc.ft)
			}
			h.checkInvariants()
		})
	}
	aborts := []struct {
		name     string
		from, to string
		ft       conn.FrameType
	}{
		{"abort_to_prefill", decodeHost, prefillHost, conn.FrameAbort},
		{"abort_to_decode", prefillHost, decodeHost, conn.FrameAbort},
		{"ack_to_prefill", decodeHost, prefillHost, conn.FrameAck},
		{"abort_ack", prefillHost, decodeHost, conn.FrameAbortAck},
	}
	for _, tc := range aborts {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 3)
			key := h.open(1, 1)
			if !h.waitBound(key, time.Second) {
				t.Fatal("not bound")
			}
			h.net.DropNext(tc.from, tc.to, 1, isFrame(tc.ft))
			var err error
			if tc.from == decodeHost && tc.ft == conn.FrameAbort || tc.ft == conn.FrameAbortAck {
				err = h.dec.Abort(context.Background(), 1, "")
			} else {
				err = h.pre.Abort(context.Background(), 1, "")
			}
			if err != nil {
				t.Fatal(err)
			}
			// The ABORT is retried at RetryBase..RetryMax: well inside one second.
			if _, ok := h.until(time.Second, func() bool { return h.bothTerminal(1) }); !ok {
				t.Fatalf("abort did not reach the peer: prefill %v decode %v", h.preState(1), h.decState(1))
			}
			h.expect(1, poll.Failed, poll.Failed)
			if h.net.Dropped() == 0 {
				t.Fatalf("no %s frame was dropped", tc.ft)
			}
			h.advance(time.Second) // the ABORT_ACK retry completes
			if n := h.pre.lk.UnackedFrames() + h.dec.lk.UnackedFrames(); n != 0 {
				t.Fatalf("%d frames still unacknowledged", n)
			}
		})
	}
}

// A lost ACK makes the sender retransmit; the receiver recognises the
// duplicate by (sender, epoch, seq), answers it again and applies nothing
// twice.
//
// The duplicate is counted, but logged at debug only: a retransmit that
// crossed its ACK is normal, and a burst of them under load (about 500/s
// when 100k rooms were bound at once) filled prefilld's log with
// warnings an on-call engineer would chase.
func TestDuplicateAfterLostAckIsReackedNotReapplied(t *testing.T) {
	logs, seen := observer.New(zap.InfoLevel)
	h := newHarnessWith(t, 4, options{pre: func(c *PrefillConfig) { c.Logger = zap.New(logs) }})
	h.runToEnd(h.open(9, 1), 1) // the session is up and registered
	h.net.DropNext(prefillHost, decodeHost, 1, isFrame(conn.FrameAck))
	key := h.open(1, 1)
	if _, ok := h.until(time.Second, func() bool { return h.decState(1) == poll.WaitingForInput }); !ok || h.net.Dropped() != 1 {
		t.Fatalf("metadata never acknowledged: decode %v", h.decState(1))
	}
	h.runToEnd(key, 1)
	h.expect(1, poll.Success, poll.Success)
	if n := h.pre.Counters().Rejected(conn.RejectDuplicate); n == 0 {
		t.Fatal("retransmitted METADATA was not seen as a duplicate")
	}
	for _, e := range seen.FilterMessage("frame rejected").All() {
		t.Errorf("logged at %v: frame rejected %v", e.Level, e.ContextMap())
	}
	if n := len(h.preDP.binds[key]); n != 1 {
		t.Fatalf("metadata applied %d times, want 1", n)
	}
}

// Duplication and reordering of every frame in both directions.
func TestDuplicationAndReorderingOfEverything(t *testing.T) {
	h := newHarness(t, 5)
	f := conn.LinkFaults{Duplicate: 0.5, Reorder: 0.5, MaxHold: 60 * time.Millisecond}
	h.net.SetFaults(decodeHost, prefillHost, f)
	h.net.SetFaults(prefillHost, decodeHost, f)
	const rooms = 20
	keys := make([]poll.Key, 0, rooms)
	for r := poll.RoomID(1); r <= rooms; r++ {
		keys = append(keys, h.open(r, 1))
	}
	for _, k := range keys {
		h.runToEnd(k, 1)
		h.expect(k.Room, poll.Success, poll.Success)
	}
	for _, k := range keys {
		if n := len(h.preDP.binds[k]); n != 1 {
			t.Fatalf("room %d bound %d times", k.Room, n)
		}
	}
	if h.pre.Counters().Rejected(conn.RejectDuplicate) == 0 {
		t.Fatal("no duplicate was detected under 50% duplication")
	}
	h.checkInvariants()
}

// A partition shorter than the heartbeat bound heals without loss.
func TestPartitionHealedInTimeSucceeds(t *testing.T) {
	h := newHarness(t, 6)
	key := h.open(1, 1)
	h.waitBound(key, time.Second)
	h.net.Partition(prefillHost, decodeHost)
	h.transfer(key, 1) // decode Success; its STATUS is lost in the partition
	h.advance(tHeartbeat * (tMisses - 1))
	h.net.Heal(prefillHost, decodeHost)
	if _, ok := h.until(time.Second, func() bool { return h.bothTerminal(1) }); !ok {
		t.Fatalf("pinned: prefill %v decode %v", h.preState(1), h.decState(1))
	}
	h.expect(1, poll.Success, poll.Success)
	if c := h.pre.Counters(); c.PeersLost != 0 {
		t.Fatalf("peer declared lost after a short partition")
	}
}

// A partition that outlasts the heartbeat misses fails every bound room
// with peer_lost on both sides within the heartbeat bound, and new rooms
// work once it heals.
func TestPartitionOutlastingMissesFailsRoomsPeerLost_R10(t *testing.T) {
	h := newHarness(t, 7)
	k1, k2 := h.open(1, 1), h.open(2, 1)
	h.waitBound(k1, time.Second)
	h.waitBound(k2, time.Second)
	h.net.Partition(prefillHost, decodeHost)
	bound := tHeartbeat*tMisses + 2*tHeartbeat
	took, ok := h.until(bound, func() bool { return h.bothTerminal(1, 2) })
	if !ok {
		t.Fatalf("not failed within %v: prefill %v decode %v", bound, h.preState(1), h.decState(1))
	}
	for _, r := range []poll.RoomID{1, 2} {
		h.expect(r, poll.Failed, poll.Failed)
		if pr, _ := h.reason(h.pre, r); pr != poll.ReasonPeerLost {
			t.Errorf("prefill reason %q, want peer_lost", pr)
		}
		if dr, _ := h.reason(h.dec, r); dr != poll.ReasonPeerLost {
			t.Errorf("decode reason %q, want peer_lost", dr)
		}
	}
	t.Logf("failed after %v", took)
	h.net.Heal(prefillHost, decodeHost)
	h.advance(2 * tHeartbeat)
	k3 := h.open(3, 1)
	h.runToEnd(k3, 1)
	h.expect(3, poll.Success, poll.Success)
}
