package room

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/poll"
)

// gatedFenceDP answers every Fence "not done", as a data plane whose write is still
// reading the room's pages would; entered receives each fenced key. The test reports
// the fence done with release.
type gatedFenceDP struct {
	*fakeDP
	entered chan poll.Key
}

func newGatedFenceDP() *gatedFenceDP {
	return &gatedFenceDP{fakeDP: newFakeDP(), entered: make(chan poll.Key, 8)}
}

func (d *gatedFenceDP) Fence(k poll.Key) bool {
	d.entered <- k
	return false
}

// release is the writer letting go of the room: the data plane reports Fenced.
func (d *gatedFenceDP) release(n interface{ Fenced(poll.Key) }, k poll.Key) {
	d.fakeDP.Fence(k)
	n.Fenced(k)
}

// boundWithGatedFence is a pair whose prefill data plane holds every fence
// until released, with room 1 bound.
func boundWithGatedFence(t *testing.T, seed uint64) (*harness, *gatedFenceDP, poll.Key) {
	t.Helper()
	dp := newGatedFenceDP()
	h := newHarnessWith(t, seed, options{pre: func(c *PrefillConfig) { c.DataPlane = dp }})
	h.preDP = dp.fakeDP
	key := h.open(1, 1)
	if !h.waitBound(key, time.Second) {
		t.Fatal("room not bound")
	}
	return h, dp, key
}

// I9 on prefill: the scheduler aborts a room while the sender still reads its pages (the
// fence is held). Until the fence returns, everything the scheduler can read says the room
// is live: Poll, Get's Visible, the subscription (Watch), Clear (NOT_TERMINAL), a second
// Abort, and the error a Send (FirstSend) returns, which must not read as terminal. Once
// the fence returns, Failed is visible and published.
func TestPrefillShowsFailedOnlyAfterFence_I9(t *testing.T) {
	h, dp, key := boundWithGatedFence(t, 34)
	sub := h.pre.Subscribe(64)
	defer sub.Close()
	before := h.preState(1)

	aborted := make(chan error, 1)
	go func() { aborted <- h.pre.Abort(context.Background(), 1, "") }()
	select {
	case <-dp.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("Abort did not fence the room")
	}

	// The window: Failed inside prefill, fence held.
	if got := h.preState(1); got != before {
		t.Errorf("Poll %v before the fence, want %v", got, before)
	}
	if in, err := h.pre.Get(1); err != nil || in.State != poll.Failed || in.Visible != before {
		t.Errorf("Get before the fence: state %v visible %v (%v); want Failed held, %v visible", in.State, in.Visible, err, before)
	}
	err := h.pre.FirstSend(1)
	if err == nil || errors.Is(err, poll.ErrTerminal) || strings.Contains(err.Error(), "Failed") {
		t.Errorf("Send before the fence: %v; want a refusal that does not read as terminal", err)
	}
	errs := make([]error, 1)
	h.pre.Clear([]poll.RoomID{1}, errs)
	if !errors.Is(errs[0], poll.ErrNotTerminal) {
		t.Errorf("Clear before the fence: %v, want ErrNotTerminal", errs[0])
	}
	if err := h.pre.Abort(context.Background(), 1, ""); err != nil && !errors.Is(err, poll.ErrTerminal) {
		t.Errorf("second Abort before the fence: %v", err)
	}
	select {
	case tr := <-sub.C():
		if tr.To == poll.Failed {
			t.Errorf("Failed published before the fence: %+v", tr)
		}
	default:
	}
	select {
	case err := <-aborted:
		t.Fatalf("Abort returned before the fence: %v", err)
	default:
	}

	dp.release(h.pre, key)
	select {
	case err := <-aborted:
		if err != nil {
			t.Fatalf("Abort: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Abort did not return after the fence")
	}
	if got := h.preState(1); got != poll.Failed {
		t.Fatalf("Poll %v after the fence, want Failed", got)
	}
	select {
	case tr := <-sub.C():
		if tr.Key != key || tr.From != before || tr.To != poll.Failed || tr.Reason != poll.ReasonAbortedLocal {
			t.Fatalf("published %+v, want %v -> Failed(aborted:local)", tr, before)
		}
	default:
		t.Fatal("Failed not published once fenced")
	}
	if err := h.pre.FirstSend(1); !errors.Is(err, poll.ErrTerminal) {
		t.Errorf("Send after the fence: %v, want ErrTerminal", err)
	}
}

// Fenced is safe to repeat and ignores keys with no fence in progress: a data plane
// that reports twice, or reports a room it was never asked about, publishes nothing
// extra. An Abort parked on a held fence returns at its ctx with ctx's error, and the
// room's Failed still shows once the fence is done.
func TestFencedIsIdempotentAndAParkedAbortEndsWithItsContext(t *testing.T) {
	h, dp, key := boundWithGatedFence(t, 35)
	sub := h.pre.Subscribe(64)
	defer sub.Close()
	h.pre.Fenced(poll.Key{Room: 7, Nonce: 7}) // never fenced: ignored
	h.pre.Fenced(key)                         // not failed, no fence asked: ignored
	if got := h.preState(1); got != poll.WaitingForInput {
		t.Fatalf("Poll %v after a stray Fenced, want WaitingForInput", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	aborted := make(chan error, 1)
	go func() { aborted <- h.pre.Abort(ctx, 1, "") }()
	select {
	case <-dp.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("Abort did not fence the room")
	}
	cancel()
	select {
	case err := <-aborted:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("parked Abort ended by its ctx returned %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a parked Abort did not return when its ctx ended")
	}
	if got := h.preState(1); got != poll.WaitingForInput {
		t.Fatalf("Poll %v while the fence is held, want WaitingForInput", got)
	}
	dp.release(h.pre, key)
	h.pre.Fenced(key) // reported twice
	if got := h.preState(1); got != poll.Failed {
		t.Fatalf("Poll %v after Fenced, want Failed", got)
	}
	failed := 0
	for drained := false; !drained; {
		select {
		case tr := <-sub.C():
			if tr.Key.Room == 1 && tr.To == poll.Failed {
				failed++
			}
		default:
			drained = true
		}
	}
	if failed != 1 {
		t.Fatalf("Failed published %d times, want once", failed)
	}
}

// A call that learned its room ended (a Send whose transfer the fence
// refused) waits with AwaitFailedVisible until the scheduler can see the
// Failed, so it never answers with the hidden state ("Transferring and
// ending"). A live room returns at once; ctx ends the wait.
func TestAwaitFailedVisibleWaitsForTheFence(t *testing.T) {
	h, dp, key := boundWithGatedFence(t, 36)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := h.pre.AwaitFailedVisible(ctx, 1); err != nil {
		t.Fatalf("live room: %v", err)
	}
	if err := h.pre.AwaitFailedVisible(ctx, 99); err != nil {
		t.Fatalf("unknown room: %v", err)
	}
	abortCtx, abortCancel := context.WithCancel(context.Background())
	aborted := make(chan error, 1)
	go func() { aborted <- h.pre.Abort(abortCtx, 1, "") }()
	select {
	case <-dp.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("Abort did not fence the room")
	}
	abortCancel()
	<-aborted

	short, shortCancel := context.WithCancel(ctx)
	shortCancel()
	if err := h.pre.AwaitFailedVisible(short, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait ended by its ctx returned %v, want context.Canceled", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- h.pre.AwaitFailedVisible(ctx, 1) }()
	if !h.waitReal(5*time.Second, func() bool { return h.pre.parkedCalls.Load() == 1 }) {
		t.Fatal("the wait never parked")
	}
	select {
	case err := <-waited:
		t.Fatalf("returned %v while the fence is held", err)
	default:
	}
	dp.release(h.pre, key)
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("still waiting after the fence was done")
	}
	if got := h.preState(1); got != poll.Failed {
		t.Fatalf("Poll %v once the wait returned, want Failed", got)
	}
}
