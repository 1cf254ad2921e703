package room

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

func mustMarshal(t testing.TB, env *pdlinkv1.Envelope) []byte {
	t.Helper()
	b, err := proto.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func rogueEnv(seq uint64) *pdlinkv1.Envelope {
	return &pdlinkv1.Envelope{ProtocolVersion: conn.ProtocolVersion, SenderInstance: "evil-1", Epoch: 99, Seq: seq}
}

// R12: undecodable, wrong-version, bodiless, oversized and over-limit
// frames, frames from an unregistered sender, and frames about a room
// bound to another peer are rejected and counted by reason; the listener
// never stops and other rooms keep working.
func TestHostileFramesRejectedAndCountedListenerSurvives_R12(t *testing.T) {
	h := newHarnessWith(t, 30, options{pre: func(c *PrefillConfig) { c.Limits.MaxFrameBytes = 4096 }})
	key := h.open(1, 1)
	h.waitBound(key, time.Second)

	evil, send := h.rogue()
	metadata := func(seq uint64, k poll.Key, pages *pdlinkv1.PageList) []byte {
		env := rogueEnv(seq)
		env.Body = &pdlinkv1.Envelope_Metadata{Metadata: &pdlinkv1.Metadata{RoomId: uint64(k.Room), Nonce: uint64(k.Nonce), DstPages: pages, ExpectedSenders: 1}}
		return mustMarshal(t, env)
	}
	pages := &pdlinkv1.PageList{Indices: []int32{7}}

	send([]byte{0xff, 0xff, 0xff, 0x01}) // decode
	send(make([]byte, 8192))             // too_large
	v2 := rogueEnv(1)
	v2.ProtocolVersion = 2
	v2.Body = &pdlinkv1.Envelope_Heartbeat{Heartbeat: &pdlinkv1.Heartbeat{}}
	send(mustMarshal(t, v2))                                                                                                  // version
	send(mustMarshal(t, rogueEnv(1)))                                                                                         // invalid: no body
	send(metadata(2, poll.Key{Room: 5, Nonce: 5}, &pdlinkv1.PageList{Runs: []*pdlinkv1.PageRun{{Start: 0, Count: 1 << 30}}})) // too_large: pages
	send(metadata(3, poll.Key{Room: 5, Nonce: 5}, &pdlinkv1.PageList{Indices: []int32{1, 1}}))                                // invalid: page twice
	send(metadata(4, key, pages))                                                                                             // unknown_peer: not registered

	reg := rogueEnv(10)
	reg.Body = &pdlinkv1.Envelope_Register{Register: &pdlinkv1.Register{InstanceId: "evil-1", DataEndpoint: "10.6.6.6:1"}}
	send(mustMarshal(t, reg))
	send(metadata(11, key, pages)) // foreign_room: room 1 is bound to the real decode
	ab := rogueEnv(12)
	ab.Body = &pdlinkv1.Envelope_Abort{Abort: &pdlinkv1.Abort{RoomId: uint64(key.Room), Nonce: uint64(key.Nonce)}}
	send(mustMarshal(t, ab)) // foreign_room again: an abort of someone else's room

	c := h.pre.Counters()
	for r, want := range map[conn.RejectReason]uint64{
		conn.RejectDecode: 1, conn.RejectTooLarge: 2, conn.RejectVersion: 1, conn.RejectInvalid: 2, conn.RejectUnknownPeer: 1, conn.RejectForeignRoom: 2,
	} {
		if got := c.Rejected(r); got != want {
			t.Errorf("rejected %s: %d, want %d", r, got, want)
		}
	}
	// The rogue got answers for the frames that asked for one.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	results := map[pdlinkv1.AckResult]int{}
	for range 4 { // unknown_peer, REGISTER, two foreign_room: invalid frames get no answer
		b, err := evil.Recv(ctx)
		if err != nil {
			t.Fatalf("rogue got %v answers, then %v", results, err)
		}
		env := &pdlinkv1.Envelope{}
		_ = proto.Unmarshal(b, env)
		results[env.GetAck().GetResult()]++
	}

	// The room under attack and a new one are unharmed.
	h.transfer(key, 1)
	h.runToEnd(h.open(2, 1), 1)
	if _, ok := h.until(time.Second, func() bool { return h.bothTerminal(1) }); !ok {
		t.Fatal("room 1 pinned")
	}
	h.expect(1, poll.Success, poll.Success)
	h.expect(2, poll.Success, poll.Success)
	if c.WorkerRestarts != 0 {
		t.Fatalf("bad input restarted %d workers", c.WorkerRestarts)
	}
}

// R6: a handler that panics kills the prefill's receive worker; the
// supervisor recovers, counts and restarts it, and the room still reaches
// Success because the lost METADATA is retransmitted.
func TestHandlerPanicIsRecoveredAndRoomsStillEnd_R6(t *testing.T) {
	var armed atomic.Bool
	armed.Store(true)
	h := newHarnessWith(t, 31, options{pre: func(c *PrefillConfig) {
		c.FrameHook = func(ft conn.FrameType) {
			if ft == conn.FrameMetadata && armed.CompareAndSwap(true, false) {
				panic("injected handler fault")
			}
		}
	}})
	key := h.open(1, 1)
	h.runToEnd(key, 1)
	h.expect(1, poll.Success, poll.Success)
	if n := h.pre.Counters().WorkerRestarts; n != 1 {
		t.Fatalf("worker restarts %d, want 1", n)
	}
	h.runToEnd(h.open(2, 1), 1)
	h.expect(2, poll.Success, poll.Success)
}

// R6: the bootstrap socket dies under the listener. Its supervisor binds
// the address again; rooms in flight and new rooms complete.
func TestDeadListenerIsReboundBySupervisor_R6(t *testing.T) {
	h := newHarness(t, 32)
	key := h.open(1, 1)
	h.waitBound(key, time.Second)
	if !h.net.KillListener(prefillAddr) {
		t.Fatal("no listener to kill")
	}
	// The restart runs on the supervisor's goroutine. Wait for it before
	// moving the clock: frames sent while nothing is bound are lost without
	// queueing anything, so the network looks idle, and advancing virtual
	// time then runs the rooms into their deadlines before the supervisor
	// was even scheduled.
	if !h.waitReal(5*time.Second, func() bool {
		return h.pre.Counters().WorkerRestarts == 1 && h.net.Bound(prefillAddr)
	}) {
		t.Fatalf("listener not bound again: restarts %d, bound %v", h.pre.Counters().WorkerRestarts, h.net.Bound(prefillAddr))
	}
	h.advance(5 * tTick)
	h.transfer(key, 1)
	h.runToEnd(key, 1)
	h.expect(1, poll.Success, poll.Success)
	h.runToEnd(h.open(2, 1), 1)
	h.expect(2, poll.Success, poll.Success)
	if n := h.pre.Counters().WorkerRestarts; n != 1 {
		t.Fatalf("worker restarts %d, want 1", n)
	}
}

// panicFenceDP panics on the first Fence of a room.
type panicFenceDP struct {
	*fakeDP
	armed atomic.Bool
}

func (d *panicFenceDP) Fence(k poll.Key) bool {
	if d.armed.CompareAndSwap(true, false) {
		panic("injected fence fault")
	}
	return d.fakeDP.Fence(k)
}

// R6/I9: a data plane whose Fence panics (inside the tick worker, on a
// timeout) is recovered and counted; the fence is retried and the room's
// Failed state is published only after it worked.
func TestPanickingFenceIsRetriedBeforeFailedIsVisible_R6(t *testing.T) {
	dp := &panicFenceDP{fakeDP: newFakeDP()}
	dp.armed.Store(true)
	h := newHarnessWith(t, 33, options{dec: func(c *DecodeConfig) { c.DataPlane = dp }})
	h.decDP = dp.fakeDP
	key := h.open(1, 1)
	h.waitBound(key, time.Second)
	// The Abort is parked until the retried fence works (the next tick).
	aborted := make(chan error, 1)
	go func() { aborted <- h.dec.Abort(context.Background(), 1, "") }()
	if !h.waitReal(5*time.Second, func() bool { return h.dec.Counters().WorkerRestarts == 1 }) {
		t.Fatal("the fence did not run")
	}
	if got := h.decState(1); got == poll.Failed {
		t.Fatal("Failed visible before the room was fenced")
	}
	if _, ok := h.until(time.Second, func() bool { return h.bothTerminal(1) }); !ok {
		t.Fatalf("pinned: prefill %v decode %v", h.preState(1), h.decState(1))
	}
	select {
	case err := <-aborted:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Abort did not return once Failed was visible")
	}
	if !dp.isFenced(key) || h.dec.Counters().WorkerRestarts != 1 {
		t.Fatalf("fenced %v restarts %d", dp.isFenced(key), h.dec.Counters().WorkerRestarts)
	}
}
