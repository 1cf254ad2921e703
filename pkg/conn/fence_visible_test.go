package conn

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/poll"
)

// gatedFenceDP holds every Fence until release is closed, as a data-plane write that is
// still reading the room's pages would; entered receives each fenced key first.
type gatedFenceDP struct {
	*fakeDP
	entered chan poll.Key
	release chan struct{}
}

func newGatedFenceDP() *gatedFenceDP {
	return &gatedFenceDP{fakeDP: newFakeDP(), entered: make(chan poll.Key, 8), release: make(chan struct{})}
}

func (d *gatedFenceDP) Fence(k poll.Key) {
	d.entered <- k
	<-d.release
	d.fakeDP.Fence(k)
}

// I9 on prefill: the scheduler aborts a room while the sender still reads its pages (the
// fence is held). Until the fence returns, everything the scheduler can read says the room
// is live: Poll, Get's Visible, the subscription (Watch), Clear (NOT_TERMINAL), a second
// Abort, and the error a Send (FirstSend) returns, which must not read as terminal. Once
// the fence returns, Failed is visible and published.
func TestPrefillShowsFailedOnlyAfterFence_I9(t *testing.T) {
	dp := newGatedFenceDP()
	h := newHarnessWith(t, 34, options{pre: func(c *PrefillConfig) { c.DataPlane = dp }})
	h.preDP = dp.fakeDP
	released := false
	t.Cleanup(func() {
		if !released {
			close(dp.release) // let a test that stopped early shut its nodes down
		}
	})
	key := h.open(1, 1)
	if !h.waitBound(key, time.Second) {
		t.Fatal("room not bound")
	}
	sub := h.pre.Subscribe(64)
	defer sub.Close()
	before := h.preState(1)

	aborted := make(chan error, 1)
	go func() { aborted <- h.pre.Abort(1, "") }()
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
	if err := h.pre.Abort(1, ""); err != nil && !errors.Is(err, poll.ErrTerminal) {
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

	released = true
	close(dp.release)
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
