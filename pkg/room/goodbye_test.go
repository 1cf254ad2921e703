package room

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

// lostBound is how long a silent peer takes to be declared lost, plus
// slack for ticks.
const lostBound = tHeartbeat*tMisses + 4*tTick

// shutdownAsync runs node.Shutdown(ctx) on its own goroutine (it waits in
// real time for ACKs that the fake clock's retransmits may have to carry).
func shutdownAsync(ctx context.Context, node interface{ Shutdown(context.Context) }) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		node.Shutdown(ctx)
	}()
	return done
}

// waitShutdown advances the fake clock until Shutdown returned, bounded
// in real time.
func (h *harness) waitShutdown(done <-chan struct{}) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-done:
			return
		default:
		}
		if time.Now().After(deadline) {
			h.t.Fatal("Shutdown did not return")
		}
		h.advance(tTick)
	}
}

// tap records every frame of type ft from -> to (the frame still goes).
func tap(net *conn.MemNetwork, from, to string, ft conn.FrameType) func() [][]byte {
	var mu sync.Mutex
	var seen [][]byte
	match := isFrame(ft)
	net.DropNext(from, to, 1, func(b []byte) bool {
		if match(b) {
			mu.Lock()
			seen = append(seen, append([]byte(nil), b...))
			mu.Unlock()
		}
		return false
	})
	return func() [][]byte {
		mu.Lock()
		defer mu.Unlock()
		return append([][]byte(nil), seen...)
	}
}

// dropNextCounted is DropNext of the next count frames of type ft from ->
// to; it returns how many that rule dropped. Network.Dropped also counts a
// frame lost to a closed receiver: a first copy sent late (its sender
// descheduled between queueing it for retransmit and sending it, so a
// retransmit went first) reaches a decode that already closed the
// departed session.
func dropNextCounted(net *conn.MemNetwork, from, to string, count int, ft conn.FrameType) func() int {
	var n atomic.Int64
	match := isFrame(ft)
	net.DropNext(from, to, count, func(b []byte) bool {
		if match(b) {
			n.Add(1)
			return true
		}
		return false
	})
	return func() int { return int(n.Load()) }
}

func goodbyeFrom(instance string, epoch, seq uint64) *pdlinkv1.Envelope {
	return &pdlinkv1.Envelope{ProtocolVersion: conn.ProtocolVersion, SenderInstance: instance, Epoch: epoch, Seq: seq,
		Body: &pdlinkv1.Envelope_Goodbye{Goodbye: &pdlinkv1.Goodbye{}}}
}

// The issue: decoded stops cleanly (SIGTERM, nothing in flight). prefilld
// forgets it at once, never counts it lost (not even after the heartbeat
// bound passes), and a decode that comes back, as a new instance or as the
// same one restarted, registers as a new peer, not as a restart.
func TestDecodeGoodbyeIsForgottenNotCountedLost(t *testing.T) {
	for _, sameInstance := range []bool{false, true} {
		name := map[bool]string{false: "new_instance", true: "same_instance"}[sameInstance]
		t.Run(name, func(t *testing.T) {
			var o options
			if sameInstance {
				o.dec = func(c *DecodeConfig) { c.Instance = "decode-pod-0" }
			}
			h := newHarnessWith(t, 40, o)
			h.runToEnd(h.open(1, 1), 1)
			if n := len(h.pre.Peers()); n != 1 {
				t.Fatalf("prefill knows %d peers before the goodbye", n)
			}
			h.waitShutdown(shutdownAsync(context.Background(), h.dec))
			_ = h.dec.Close()
			c := h.pre.Counters()
			if len(h.pre.Peers()) != 0 || c.PeersUp != 0 || c.PeersDown != 0 || c.PeerGoodbyes != 1 {
				t.Fatalf("after goodbye: peers %d up %d down %d goodbyes %d", len(h.pre.Peers()), c.PeersUp, c.PeersDown, c.PeerGoodbyes)
			}
			h.advance(2 * lostBound)
			if c := h.pre.Counters(); c.PeersLost != 0 || c.PeersDown != 0 {
				t.Fatalf("a decode that said goodbye was counted lost: lost %d down %d", c.PeersLost, c.PeersDown)
			}

			h.startDecode()
			h.runToEnd(h.open(2, 1), 1)
			h.expect(2, poll.Success, poll.Success)
			c = h.pre.Counters()
			if len(h.pre.Peers()) != 1 || c.PeersUp != 1 || c.PeerRestarts != 0 || c.PeersLost != 0 {
				t.Fatalf("the decode back: peers %d up %d restarts %d lost %d", len(h.pre.Peers()), c.PeersUp, c.PeerRestarts, c.PeersLost)
			}
			h.checkInvariants()
		})
	}
}

// The other direction: prefilld stops cleanly. Its Shutdown fails the
// live room and tells decode (R8), then says goodbye: decode forgets the
// session without counting the prefill lost, and a prefill back at the
// same address gets a new session that registers (no restart counted).
func TestPrefillGoodbyeDecodeForgetsTheSession(t *testing.T) {
	h := newHarnessWith(t, 41, options{dec: func(c *DecodeConfig) { c.Table.WaitingTimeout = 10 * tWait }})
	key := h.open(1, 1)
	h.waitBound(key, time.Second)
	h.waitShutdown(shutdownAsync(context.Background(), h.pre))
	if _, pr := h.reason(h.dec, 1); h.decState(1) != poll.Failed || pr != poll.ReasonShutdown {
		t.Fatalf("decode room %v (peer reason %q): the shutdown notice did not come first", h.decState(1), pr)
	}
	c := h.dec.Counters()
	if len(h.dec.Peers()) != 0 || c.PeersUp != 0 || c.PeerGoodbyes != 1 {
		t.Fatalf("after goodbye: sessions %d up %d goodbyes %d", len(h.dec.Peers()), c.PeersUp, c.PeerGoodbyes)
	}
	_ = h.pre.Close()
	h.advance(2 * lostBound)
	if c := h.dec.Counters(); c.PeersLost != 0 || c.PeersDown != 0 {
		t.Fatalf("a prefill that said goodbye was counted lost: lost %d down %d", c.PeersLost, c.PeersDown)
	}

	h.startPrefill()
	h.runToEnd(h.open(2, 1), 1)
	h.expect(2, poll.Success, poll.Success)
	if c := h.dec.Counters(); len(h.dec.Peers()) != 1 || c.PeerRestarts != 0 || c.PeersLost != 0 {
		t.Fatalf("the prefill back: sessions %d restarts %d lost %d", len(h.dec.Peers()), c.PeerRestarts, c.PeersLost)
	}
}

// A room still live on the receiver when the goodbye lands (its notice
// did not make it within the drain) fails there at once, as its shutdown
// ABORT would have made it, instead of waiting out a deadline.
func TestGoodbyeFailsRoomsStillBoundToTheSender(t *testing.T) {
	h := newHarnessWith(t, 42, options{pre: func(c *PrefillConfig) { c.Table.WaitingTimeout = 10 * tWait }})
	key := h.open(1, 1)
	h.waitBound(key, time.Second)
	h.net.DropNext(decodeHost, prefillHost, 1000, isFrame(conn.FrameAbort)) // every shutdown notice
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	h.waitShutdown(shutdownAsync(ctx, h.dec))
	if _, ok := h.until(5*tTick, func() bool { return h.preState(1) == poll.Failed }); !ok {
		t.Fatalf("prefill room %v after the goodbye", h.preState(1))
	}
	if r, pr := h.reason(h.pre, 1); r != poll.ReasonAbortedRemote || pr != poll.ReasonShutdown {
		t.Fatalf("prefill reason %q peer reason %q, want aborted:remote / shutdown", r, pr)
	}
	if !h.preDP.isFenced(key) {
		t.Fatal("the room failed without its data plane fenced")
	}
	if c := h.pre.Counters(); c.PeerGoodbyes != 1 || c.PeersLost != 0 {
		t.Fatalf("goodbyes %d lost %d", c.PeerGoodbyes, c.PeersLost)
	}
}

// Lost on the wire: a GOODBYE dropped again and again is retried until
// acknowledged, and the leaver heartbeats meanwhile, so the receiver does
// not count it lost although the retries outlast the heartbeat bound; a
// dropped ACK makes the leaver send it again, and the receiver, which
// already forgot the peer, acknowledges the copy as a duplicate without
// applying it twice. Shutdown returns only once an ACK came back.
func TestGoodbyeIsRetriedUntilAcknowledgedAndIdempotent(t *testing.T) {
	cases := []struct {
		name    string
		leaver  string // the host that shuts down
		drop    conn.FrameType
		drops   int
		wantDup uint64 // duplicates the receiver must answer
	}{
		// Eight copies at 20ms doubling to 200ms, jittered down to half: past lostBound.
		{"decode_goodbye_dropped", decodeHost, conn.FrameGoodbye, 8, 0},
		// Two ACKs: the second copy comes well after the receiver's next
		// tick, so a receiver that stopped listening at once is caught.
		{"decode_goodbye_ack_dropped", decodeHost, conn.FrameAck, 2, 2},
		{"prefill_goodbye_dropped", prefillHost, conn.FrameGoodbye, 8, 0},
		{"prefill_goodbye_ack_dropped", prefillHost, conn.FrameAck, 2, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 43)
			h.runToEnd(h.open(1, 1), 1)
			h.advance(2 * tHeartbeat) // every room frame acknowledged
			var leaver interface{ Shutdown(context.Context) } = h.dec
			stayer, other := h.pre.Counters, prefillHost
			if tc.leaver == prefillHost {
				leaver, stayer, other = h.pre, h.dec.Counters, decodeHost
			}
			from, to := tc.leaver, other
			if tc.drop == conn.FrameAck {
				from, to = other, tc.leaver
			}
			dropped := dropNextCounted(h.net, from, to, tc.drops, tc.drop)
			before := stayer()
			start := h.clk.Now()
			h.waitShutdown(shutdownAsync(context.Background(), leaver))
			if got := dropped(); got != tc.drops {
				t.Fatalf("%d %s frames dropped, want %d", got, tc.drop, tc.drops)
			}
			if took := h.clk.Now().Sub(start); tc.drop == conn.FrameGoodbye && took < lostBound {
				t.Fatalf("the retries took %v, under the heartbeat bound %v: the test proves nothing", took, lostBound)
			}
			c := stayer()
			if c.PeerGoodbyes != 1 || c.PeersLost != 0 || c.PeersUp != 0 {
				t.Fatalf("goodbyes %d lost %d up %d, want the peer forgotten once", c.PeerGoodbyes, c.PeersLost, c.PeersUp)
			}
			// A retransmit may also cross a slow ACK: at least wantDup.
			dup := c.Rejected(conn.RejectDuplicate) - before.Rejected(conn.RejectDuplicate)
			if dup < tc.wantDup || c.RejectedTotal()-before.RejectedTotal() != dup {
				t.Fatalf("receiver rejected %d frames (%d duplicates), want only duplicates, at least %d",
					c.RejectedTotal()-before.RejectedTotal(), dup, tc.wantDup)
			}
		})
	}
}

// The goodbye never arrives (every copy lost, the drain ends): the peer
// is treated as before, lost once its heartbeats stop.
func TestGoodbyeLostOnTheWireFallsBackToLost(t *testing.T) {
	h := newHarness(t, 44)
	h.runToEnd(h.open(1, 1), 1)
	h.net.DropNext(decodeHost, prefillHost, 1000, isFrame(conn.FrameGoodbye))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	h.waitShutdown(shutdownAsync(ctx, h.dec))
	h.dec.kill()
	if _, ok := h.until(2*lostBound, func() bool { return h.pre.Counters().PeersLost == 1 }); !ok {
		t.Fatalf("decode whose goodbye was lost: lost %d", h.pre.Counters().PeersLost)
	}
	if c := h.pre.Counters(); c.PeersDown != 1 || c.PeerGoodbyes != 0 {
		t.Fatalf("down %d goodbyes %d", c.PeersDown, c.PeerGoodbyes)
	}
}

// kill -9: no goodbye, the peer is lost after missed heartbeats (both
// sides), as before.
func TestVanishedPeerIsStillCountedLost_R10(t *testing.T) {
	t.Run("decode", func(t *testing.T) {
		h := newHarness(t, 45)
		h.runToEnd(h.open(1, 1), 1)
		h.dec.kill()
		if _, ok := h.until(2*lostBound, func() bool { return h.pre.Counters().PeersLost == 1 }); !ok {
			t.Fatalf("vanished decode: lost %d", h.pre.Counters().PeersLost)
		}
		if c := h.pre.Counters(); c.PeersDown != 1 || c.PeerGoodbyes != 0 {
			t.Fatalf("down %d goodbyes %d", c.PeersDown, c.PeerGoodbyes)
		}
	})
	t.Run("prefill", func(t *testing.T) {
		h := newHarness(t, 46)
		h.runToEnd(h.open(1, 1), 1)
		h.pre.kill()
		if _, ok := h.until(2*lostBound, func() bool { return h.dec.Counters().PeersLost == 1 }); !ok {
			t.Fatalf("vanished prefill: lost %d", h.dec.Counters().PeersLost)
		}
		if c := h.dec.Counters(); c.PeersDown != 1 || c.PeerGoodbyes != 0 {
			t.Fatalf("down %d goodbyes %d", c.PeersDown, c.PeerGoodbyes)
		}
	})
}

// A goodbye is authenticated like every frame: one sealed with another key,
// or carrying a MAC lifted from another frame, is rejected as auth, and a
// genuine goodbye of an earlier incarnation replayed after the decode came
// back does not make prefill forget the new one. The live peer and its
// room are untouched.
func TestForgedOrReplayedGoodbyeDoesNotForgetALivePeer(t *testing.T) {
	o := options{
		pre: func(c *PrefillConfig) { c.Auth = sumAuth{1} },
		dec: func(c *DecodeConfig) { c.Auth = sumAuth{1} },
	}
	h := newHarnessWith(t, 47, o)
	goodbyes := tap(h.net, decodeHost, prefillHost, conn.FrameGoodbye)
	h.runToEnd(h.open(1, 1), 1)
	h.waitShutdown(shutdownAsync(context.Background(), h.dec))
	_ = h.dec.Close()
	replay := goodbyes()
	if len(replay) == 0 { // more than one if a retransmit crossed the ACK
		t.Fatal("no goodbye tapped")
	}
	h.advance(tTick)
	h.startDecode()
	key := h.open(2, 1)
	h.waitBound(key, time.Second)
	inst, epoch := h.dec.Instance()

	evil, send := h.rogue()
	otherKey := &conn.Codec{Auth: sumAuth{2}}
	forged, err := otherKey.Encode(goodbyeFrom(inst, epoch, 1<<40))
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := (&conn.Codec{Auth: sumAuth{1}}).Encode(&pdlinkv1.Envelope{ProtocolVersion: conn.ProtocolVersion, SenderInstance: inst, Epoch: epoch,
		Body: &pdlinkv1.Envelope_Heartbeat{Heartbeat: &pdlinkv1.Heartbeat{}}})
	if err != nil {
		t.Fatal(err)
	}
	hb := &pdlinkv1.Envelope{}
	if err := proto.Unmarshal(sealed, hb); err != nil {
		t.Fatal(err)
	}
	lifted := goodbyeFrom(inst, epoch, 1<<40+1)
	lifted.Mac = hb.GetMac()

	authBefore := h.pre.Counters().Rejected(conn.RejectAuth)
	send(forged)
	send(mustMarshal(t, lifted))
	send(replay[0])
	// The replay is answered like the departed decode's own retransmit
	// would be (the evil host reads it, so the network goes idle).
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := evil.Recv(ctx)
	if err != nil {
		t.Fatalf("no answer to the replayed goodbye: %v", err)
	}
	ack := &pdlinkv1.Envelope{}
	if err := proto.Unmarshal(b, ack); err != nil || ack.GetAck().GetResult() != pdlinkv1.AckResult_ACK_RESULT_APPLIED {
		t.Fatalf("answer to the replayed goodbye: %v %v", ack, err)
	}
	_ = evil.Close() // its queue would never look idle again
	h.advance(2 * tHeartbeat)

	c := h.pre.Counters()
	if got := c.Rejected(conn.RejectAuth) - authBefore; got != 2 {
		t.Errorf("auth rejections %d, want 2 (wrong key, lifted MAC)", got)
	}
	if c.PeerGoodbyes != 1 || c.PeersUp != 1 || len(h.pre.Peers()) != 1 {
		t.Fatalf("after forged and replayed goodbyes: goodbyes %d up %d peers %d, want the live decode kept", c.PeerGoodbyes, c.PeersUp, len(h.pre.Peers()))
	}
	if p := h.pre.Peers()[0]; p.Instance != inst || p.Epoch != epoch {
		t.Fatalf("prefill's peer is %s@%d, want the live %s@%d", p.Instance, p.Epoch, inst, epoch)
	}
	h.transfer(key, 1)
	if _, ok := h.until(tBound, func() bool { return h.bothTerminal(2) }); !ok {
		t.Fatal("room 2 pinned")
	}
	h.expect(2, poll.Success, poll.Success)
}

// After its goodbye, a delayed frame of the departed incarnation (here its
// REGISTER retransmitted) is refused, so it does not come back as a peer
// that then goes silent and is counted lost.
func TestLateRegisterOfADepartedDecodeIsRefused(t *testing.T) {
	h := newHarness(t, 48)
	registers := tap(h.net, decodeHost, prefillHost, conn.FrameRegister)
	h.runToEnd(h.open(1, 1), 1)
	h.waitShutdown(shutdownAsync(context.Background(), h.dec))
	h.dec.kill()
	late := registers()
	if len(late) == 0 {
		t.Fatal("no REGISTER tapped")
	}
	evil, err := h.net.Host(decodeHost).Dial(context.Background(), prefillAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Close()
	if err := evil.Send(context.Background(), late[0]); err != nil {
		t.Fatal(err)
	}
	h.advance(2 * lostBound)
	c := h.pre.Counters()
	if len(h.pre.Peers()) != 0 || c.PeersLost != 0 || c.Rejected(conn.RejectStaleEpoch) == 0 {
		t.Fatalf("late REGISTER: peers %d lost %d stale_epoch %d", len(h.pre.Peers()), c.PeersLost, c.Rejected(conn.RejectStaleEpoch))
	}
}
