package room

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

// R4: decode aborts a room prefill has not opened yet. The ABORT is not
// dropped: prefill keeps a tombstone, and its later Open is Failed at once.
func TestAbortBeforeOpenFailsLaterOpenAtOnce_R4(t *testing.T) {
	h := newHarness(t, 20)
	h.openDecode(1, 1)                // METADATA answered NOT_OPEN, retried
	h.advance(100 * time.Millisecond) // prefill still has no room 1
	if err := h.dec.Abort(context.Background(), 1, ""); err != nil {
		t.Fatal(err)
	}
	h.advance(100 * time.Millisecond)
	if h.pre.Stats().AbortTombstones != 1 {
		t.Fatalf("prefill kept no abort tombstone")
	}
	info, err := h.pre.Open(1, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if info.State != poll.Failed || h.preState(1) != poll.Failed {
		t.Fatalf("prefill open after abort: %v (visible %v), want Failed at once", info.State, h.preState(1))
	}
	if info.Reason != poll.ReasonAbortedRemote || info.PeerReason != poll.ReasonAbortedLocal {
		t.Fatalf("reasons %q/%q", info.Reason, info.PeerReason)
	}
	h.expect(1, poll.Failed, poll.Failed)
	if n := h.pre.Counters().Frames(conn.FrameMetadata, conn.Received); n == 0 {
		t.Fatal("metadata never reached prefill")
	}
}

// An abort racing the last chunk: whichever wins, each side ends exactly
// once, and prefill never reports Success for a room decode failed.
func TestAbortRacingLastChunkHasOneConsistentOutcome(t *testing.T) {
	h := newHarness(t, 21)
	preSub, decSub := h.pre.Subscribe(4096), h.dec.Subscribe(4096)
	defer preSub.Close()
	defer decSub.Close()
	const rounds = 40
	outcomes := map[[2]poll.State]int{}
	for i := 0; i < rounds; i++ {
		room := poll.RoomID(100 + i)
		key := h.open(room, 1)
		if !h.waitBound(key, time.Second) {
			t.Fatalf("room %d not bound", room)
		}
		_ = h.pre.FirstSend(room)
		h.dec.OnProgress(key)
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); h.dec.OnRankDone(key, 0) }() // the last chunk lands
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				_ = h.dec.Abort(context.Background(), room, "")
			} else {
				_ = h.pre.Abort(context.Background(), room, "")
			}
		}()
		wg.Wait()
		if _, ok := h.until(time.Second, func() bool { return h.bothTerminal(room) }); !ok {
			t.Fatalf("room %d pinned: prefill %v decode %v", room, h.preState(room), h.decState(room))
		}
		p, d := h.preState(room), h.decState(room)
		if p == poll.Success && d != poll.Success {
			t.Fatalf("room %d: prefill Success but decode %v", room, d)
		}
		outcomes[[2]poll.State{p, d}]++
	}
	t.Logf("outcomes (prefill, decode): %v", outcomes)
	for _, sub := range []*Subscription{preSub, decSub} {
		terminal := map[poll.RoomID]int{}
		for len(sub.C()) > 0 {
			if tr := <-sub.C(); tr.To.Terminal() {
				terminal[tr.Key.Room]++
			}
		}
		if sub.Dropped() != 0 || len(terminal) != rounds {
			t.Fatalf("terminal transitions for %d rooms (dropped %d), want %d", len(terminal), sub.Dropped(), rounds)
		}
		for r, n := range terminal {
			if n != 1 {
				t.Fatalf("room %d published %d terminal transitions", r, n)
			}
		}
	}
	h.checkInvariants()
}

// R3: metadata for a room prefill already timed out (or timed out and
// cleared) is answered ENDED with prefill's reason: decode fails at once
// instead of waiting its own timeout, and prefill creates no state.
func TestMetadataAfterPrefillTimeoutFailsDecodeFast_R3(t *testing.T) {
	for _, cleared := range []bool{false, true} {
		name := "terminal"
		if cleared {
			name = "cleared"
		}
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, 22)
			if _, err := h.pre.Open(1, 0, 0); err != nil {
				t.Fatal(err)
			}
			h.advance(tBoot + 2*tTick)
			if r, _ := h.reason(h.pre, 1); r != poll.ReasonTimeoutBootstrapping {
				t.Fatalf("prefill reason %q", r)
			}
			if cleared {
				errs := make([]error, 1)
				h.pre.Clear([]poll.RoomID{1}, errs)
				if errs[0] != nil {
					t.Fatal(errs[0])
				}
			}
			before := h.pre.Stats()
			h.openDecode(1, 1)
			took, ok := h.until(time.Second, func() bool { return h.decState(1) == poll.Failed })
			if !ok || took > 5*tTick {
				t.Fatalf("decode %v after %v, want Failed at once", h.decState(1), took)
			}
			if _, pr := h.reason(h.dec, 1); pr != poll.ReasonTimeoutBootstrapping {
				t.Fatalf("decode peer reason %q, want prefill's timeout:bootstrapping", pr)
			}
			after := h.pre.Stats()
			if after.Rooms != before.Rooms || after.Inflight != 0 || h.preDP.bound(poll.Key{Room: 1}) {
				t.Fatalf("prefill created state: rooms %d -> %d, inflight %d", before.Rooms, after.Rooms, after.Inflight)
			}
			if info, err := h.pre.Get(1); err == nil && info.Key.Nonce != 0 {
				t.Fatalf("late metadata bound the dead room to nonce %d", info.Key.Nonce)
			}
		})
	}
}

// R8: failures caused on prefill reach decode at once, with the reason:
// a timeout, a scheduler abort, a data plane failure and shutdown.
func TestPrefillSideFailuresReachDecode_R8(t *testing.T) {
	slowDecode := options{dec: func(c *DecodeConfig) { c.Table.WaitingTimeout = 10 * tWait }}
	cases := []struct {
		name string
		fail func(h *harness, key poll.Key)
		want poll.Reason
	}{
		{"timeout", func(h *harness, _ poll.Key) { h.advance(tWait + 2*tTick) }, poll.ReasonTimeoutWaitingForInput},
		{"abort", func(h *harness, k poll.Key) { _ = h.pre.Abort(context.Background(), k.Room, "") }, poll.ReasonAbortedLocal},
		{"transfer_error", func(h *harness, k poll.Key) { h.pre.OnFailed(k, poll.ReasonTransferError) }, poll.ReasonTransferError},
		{"shutdown", func(h *harness, _ poll.Key) { _ = h.pre.Close() }, poll.ReasonShutdown},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarnessWith(t, 23, slowDecode)
			key := h.open(1, 1)
			h.waitBound(key, time.Second)
			h.advance(5 * tTick) // decode got the ACK: WaitingForInput
			tc.fail(h, key)
			if _, ok := h.until(5*tTick, func() bool { return h.decState(1) == poll.Failed }); !ok {
				t.Fatalf("decode %v: prefill's failure did not reach it", h.decState(1))
			}
			if r, pr := h.reason(h.dec, 1); r != poll.ReasonAbortedRemote || pr != tc.want {
				t.Fatalf("decode reasons %q/%q, want aborted:remote/%s", r, pr, tc.want)
			}
			if !h.decDP.isFenced(key) || !h.preDP.isFenced(key) {
				t.Fatal("a side did not fence the room")
			}
		})
	}
}

// Decode-side aborts and timeouts reach prefill.
func TestDecodeSideFailuresReachPrefill(t *testing.T) {
	slowPrefill := options{pre: func(c *PrefillConfig) { c.Table.TransferIdleTimeout = 10 * tIdle }}
	h := newHarnessWith(t, 24, slowPrefill)
	key := h.open(1, 1)
	h.waitBound(key, time.Second)
	_ = h.pre.FirstSend(1)
	h.dec.OnProgress(key) // then nothing: decode's idle timeout fires
	if _, ok := h.until(tIdle+5*tTick, func() bool { return h.preState(1) == poll.Failed }); !ok {
		t.Fatalf("prefill %v", h.preState(1))
	}
	if _, pr := h.reason(h.pre, 1); pr != poll.ReasonTimeoutTransferring {
		t.Fatalf("prefill peer reason %q", pr)
	}
}

// R11: a room expecting two prefill ranks. Its STATUS is lost once: the
// retransmit saves it. A rank that never arrives fails the room at the
// deadline on both sides: never pinned.
func TestMultiRankLostFrameOrPart_R11(t *testing.T) {
	t.Run("lost_status", func(t *testing.T) {
		h := newHarness(t, 25)
		h.net.DropNext(decodeHost, prefillHost, 1, isFrame(conn.FrameStatus))
		key := h.open(1, 2)
		h.runToEnd(key, 2)
		h.expect(1, poll.Success, poll.Success)
		if info, _ := h.pre.Get(1); info.Ranks != 2 {
			t.Fatalf("prefill expects %d ranks", info.Ranks)
		}
		if h.dec.Counters().Retransmits == 0 {
			t.Fatal("no retransmit")
		}
	})
	t.Run("lost_part", func(t *testing.T) {
		h := newHarness(t, 26)
		key := h.open(1, 2)
		h.waitBound(key, time.Second)
		_ = h.pre.FirstSend(1)
		h.dec.OnProgress(key)
		h.dec.OnRankDone(key, 0)
		h.dec.OnRankDone(key, 0) // a duplicate of the same rank does not count twice
		if _, ok := h.until(tBound, func() bool { return h.bothTerminal(1) }); !ok {
			t.Fatalf("pinned: prefill %v decode %v", h.preState(1), h.decState(1))
		}
		h.expect(1, poll.Failed, poll.Failed)
		if r, _ := h.reason(h.dec, 1); r != poll.ReasonTimeoutTransferring {
			t.Fatalf("decode reason %q", r)
		}
	})
}

// R8 at SIGTERM: Shutdown fails the live rooms while the socket still
// serves and keeps retrying the notice until decode acknowledges it, even
// when the first copy is lost (Close alone sends it once).
func TestShutdownRetriesTheNoticeUntilDecodeHasIt_R8(t *testing.T) {
	h := newHarnessWith(t, 26, options{dec: func(c *DecodeConfig) { c.Table.WaitingTimeout = 10 * tWait }})
	key := h.open(1, 1)
	h.waitBound(key, time.Second)
	h.advance(5 * tTick)
	abortOrStatus := func(f []byte) bool { return isFrame(conn.FrameAbort)(f) || isFrame(conn.FrameStatus)(f) }
	h.net.DropNext(prefillHost, decodeHost, 1, abortOrStatus)
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.pre.Shutdown(context.Background())
	}()
	// Shutdown runs on its own goroutine: wait (real time) until its notice
	// is out and awaiting an ACK before moving the fake clock, or the clock
	// runs past while nothing was sent yet.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if h.pre.lk.UnackedRoomFrames() > 0 { // the notice is sent and awaits its ACK
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Shutdown sent no notice for the live room")
		}
		time.Sleep(time.Millisecond)
	}
	if _, ok := h.until(40*tTick, func() bool { return h.decState(1) == poll.Failed }); !ok {
		t.Fatalf("decode %v: the shutdown notice never arrived", h.decState(1))
	}
	if _, pr := h.reason(h.dec, 1); pr != poll.ReasonShutdown {
		t.Fatalf("decode peer reason %q, want shutdown", pr)
	}
	h.advance(5 * tTick) // the ACK reaches prefill
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return once the notice was acknowledged")
	}
}
