package room

import (
	"context"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

// R10: decode restarts behind the same data endpoint. Its new instance's
// REGISTER (newer epoch) fails every prefill room bound to the old one
// with peer_restarted at once, long before heartbeats would; new rooms
// work.
func TestDecodeRestartFailsPrefillRoomsAtOnce_R10(t *testing.T) {
	h := newHarness(t, 10)
	k1 := h.open(1, 1)
	h.waitBound(k1, time.Second)
	h.clk.Advance(time.Millisecond) // the new process starts later: a higher epoch
	h.dec.kill()
	h.startDecode()
	if _, err := h.pre.Open(2, 0, 0); err != nil {
		t.Fatal(err)
	}
	k2 := h.openDecode(2, 1) // first frames of the new instance: REGISTER
	took, ok := h.until(time.Second, func() bool { return h.preState(1) == poll.Failed })
	if !ok {
		t.Fatalf("prefill room of the dead decode: %v", h.preState(1))
	}
	if took >= tHeartbeat {
		t.Fatalf("restart seen after %v: that is heartbeat loss, not the epoch", took)
	}
	if r, _ := h.reason(h.pre, 1); r != poll.ReasonPeerRestarted {
		t.Fatalf("reason %q, want peer_restarted", r)
	}
	h.runToEnd(k2, 1)
	h.expect(2, poll.Success, poll.Success)
	if c := h.pre.Counters(); c.PeerRestarts != 1 || c.PeersLost != 0 {
		t.Fatalf("peer restarts %d lost %d", c.PeerRestarts, c.PeersLost)
	}
}

// R10 the other way: prefill restarts behind the same address. Decode
// sees the new epoch in the first frame from it (the answer to its
// heartbeat), fails its rooms with peer_restarted, registers again, and
// new rooms work.
func TestPrefillRestartFailsDecodeRoomsAtOnce_R10(t *testing.T) {
	h := newHarness(t, 11)
	k1 := h.open(1, 1)
	h.waitBound(k1, time.Second)
	h.clk.Advance(time.Millisecond)
	h.pre.kill()
	h.startPrefill()
	took, ok := h.until(time.Second, func() bool { return h.decState(1) == poll.Failed })
	if !ok {
		t.Fatalf("decode room of the dead prefill: %v", h.decState(1))
	}
	if took > tHeartbeat+2*tTick {
		t.Fatalf("restart seen after %v, want within one heartbeat", took)
	}
	if r, _ := h.reason(h.dec, 1); r != poll.ReasonPeerRestarted {
		t.Fatalf("reason %q, want peer_restarted", r)
	}
	k2 := h.open(2, 1)
	h.runToEnd(k2, 1)
	h.expect(2, poll.Success, poll.Success)
	if c := h.dec.Counters(); c.PeerRestarts != 1 {
		t.Fatalf("peer restarts %d", c.PeerRestarts)
	}
}

// A prefill that never answers is declared lost after the heartbeat
// misses; decode's rooms fail with peer_lost instead of waiting for their
// own deadlines.
func TestSilentPrefillFailsDecodeRoomsPeerLost_R10(t *testing.T) {
	h := newHarness(t, 12)
	h.pre.kill()
	nonce, err := h.dec.Open(1, prefillAddr, 1)
	if err != nil || nonce == 0 {
		t.Fatalf("open: nonce %d err %v", nonce, err)
	}
	bound := tHeartbeat*tMisses + 2*tTick
	if _, ok := h.until(bound, func() bool { return h.decState(1) == poll.Failed }); !ok {
		t.Fatalf("decode room %v after %v", h.decState(1), bound)
	}
	if r, _ := h.reason(h.dec, 1); r != poll.ReasonPeerLost {
		t.Fatalf("reason %q", r)
	}
	h.pre = nil // killed already
}

// A prefill that forgot a long-lost decode answers its frames unknown_peer:
// decode registers again and the frames go through: METADATA (its own
// handler) and ABORT (the default one).
func TestForgottenPeerRegistersAgain(t *testing.T) {
	h := newHarnessWith(t, 13, options{pre: func(c *PrefillConfig) { c.PeerForgetAfter = 500 * time.Millisecond }})
	forget := func() {
		h.net.Partition(prefillHost, decodeHost)
		h.advance(time.Second)
		h.net.Heal(prefillHost, decodeHost)
		if len(h.pre.Peers()) != 0 {
			t.Fatalf("prefill still knows %d peers", len(h.pre.Peers()))
		}
	}
	h.runToEnd(h.open(1, 1), 1)
	forget()
	h.runToEnd(h.open(2, 1), 1)
	h.expect(2, poll.Success, poll.Success)
	rejected := h.pre.Counters().Rejected(conn.RejectUnknownPeer)
	if rejected == 0 {
		t.Fatal("METADATA was not refused as unknown_peer first")
	}

	forget()
	if _, err := h.pre.Open(3, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := h.dec.Open(3, prefillAddr, 1); err != nil {
		t.Fatal(err)
	}
	if err := h.dec.Abort(context.Background(), 3, ""); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.until(time.Second, func() bool { return h.preState(3) == poll.Failed }); !ok {
		t.Fatalf("ABORT from a forgotten peer never applied: prefill %v", h.preState(3))
	}
	if h.pre.Counters().Rejected(conn.RejectUnknownPeer) == rejected {
		t.Fatal("ABORT was not refused as unknown_peer first")
	}
}

// Issue 12, R10: when prefill restarts, every decode room whose METADATA
// the old instance never applied (still Bootstrapping: METADATA retried
// against NOT_OPEN, or not sent yet) moves to the new instance and is
// served once the new scheduler opens it; the room the old instance
// applied fails with peer_restarted at once, and only it is told to the
// new instance. No room is left to a deadline.
func TestPrefillRestartMovesTheRoomsItNeverApplied_R10(t *testing.T) {
	h := newHarness(t, 14)
	applied := h.open(1, 1)
	h.waitBound(applied, time.Second)
	retried := h.openDecode(2, 1)               // the old prefill never opens it
	h.advance(500 * time.Millisecond)           // NOT_OPEN retries back off to RetryMax
	nonce, err := h.dec.Open(3, prefillAddr, 1) // METADATA not sent yet
	if err != nil {
		t.Fatal(err)
	}
	unsent := poll.Key{Room: 3, Nonce: nonce}
	h.clk.Advance(time.Millisecond)
	h.pre.kill()
	h.startPrefill()
	for _, r := range []poll.RoomID{2, 3} {
		if _, err := h.pre.Open(r, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	took, ok := h.until(time.Second, func() bool { return h.decState(1) == poll.Failed })
	if !ok || took > tHeartbeat+2*tTick {
		t.Fatalf("the applied room: decode %v after %v, want Failed within a heartbeat", h.decState(1), took)
	}
	if r, _ := h.reason(h.dec, 1); r != poll.ReasonPeerRestarted {
		t.Fatalf("the applied room failed %q, want peer_restarted", r)
	}
	if err := h.dec.SendMetadata(3, MetadataRequest{Rank: Rank{Size: 1}, DstPages: pagesOf(3), AuxIndex: 4}); err != nil {
		t.Fatalf("metadata of a moved room: %v", err)
	}
	// The retried METADATA goes again when the new REGISTER is
	// acknowledged, not at the end of its backoff (up to RetryMax).
	took, ok = h.until(tBoot/2, func() bool { return h.preDP.bound(retried) && h.preDP.bound(unsent) })
	if !ok {
		t.Fatalf("moved rooms never bound on the new prefill: decode %v %v, prefill %v %v",
			h.decState(2), h.decState(3), h.preState(2), h.preState(3))
	}
	if took > 2*tTick {
		t.Fatalf("moved rooms bound %v after decode saw the restart, want at once (REGISTER acknowledged)", took)
	}
	for _, k := range []poll.Key{retried, unsent} {
		h.transfer(k, 1)
	}
	h.until(time.Second, func() bool { return h.bothTerminal(2, 3) })
	h.expect(2, poll.Success, poll.Success)
	h.expect(3, poll.Success, poll.Success)
	if h.preDP.bound(applied) || visible(h.pre, 1) != poll.StateNone {
		t.Fatalf("the new prefill holds the applied room: %v", visible(h.pre, 1))
	}
	if s := h.dec.Stats(); s.Rebound != 2 {
		t.Fatalf("%d rooms moved, want 2", s.Rebound)
	}
	h.checkInvariants()
}

// Issue 12: a room opened while decode handles a prefill restart (Open
// read the old instance's id, the restart moved the old instance's rooms,
// then the room was created bound to the old id) moves to the new
// instance too, instead of waiting for its bootstrap deadline with no
// session to send its METADATA on.
func TestRoomOpenedDuringAPrefillRestartMovesToTheNewInstance(t *testing.T) {
	var h *harness
	restartOnce := func() {}
	h = newHarnessWith(t, 15, options{dec: func(c *DecodeConfig) { c.openHook = func() { restartOnce() } }})
	h.runToEnd(h.open(1, 1), 1) // the session is up and registered
	restartOnce = func() {
		restartOnce = func() {}
		h.clk.Advance(time.Millisecond)
		h.pre.kill()
		h.startPrefill()
		if _, ok := h.until(time.Second, func() bool { return h.dec.Counters().PeerRestarts == 1 }); !ok {
			t.Fatal("decode never saw the restart")
		}
	}
	k := h.openDecode(2, 1) // the prefill restarts inside this Open
	if _, err := h.pre.Open(2, 0, 0); err != nil {
		t.Fatal(err)
	}
	h.runToEnd(k, 1)
	h.expect(2, poll.Success, poll.Success)
}
