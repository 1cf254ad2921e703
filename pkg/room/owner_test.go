package room

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/poll"
)

// Data-plane callbacks are events: they return at once even while the
// owner is busy (here held inside the effects of room 1's abort, before
// its fence), so a transfer goroutine that calls back while it holds a
// lock of its own never waits for an owner that may be asking that data
// plane to fence. Once the owner goes on, it takes them in order and room
// 2 succeeds. This fails when a callback waits for the owner.
func TestDataPlaneCallbacksNeverWaitForTheOwner(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var enterOnce, releaseOnce sync.Once
	hook := func(effs []poll.Effect) {
		for _, e := range effs {
			if e.Kind == poll.EffFence && e.Key.Room == 1 {
				enterOnce.Do(func() {
					close(entered)
					<-release
				})
			}
		}
	}
	h := newHarnessWith(t, 43, options{dec: func(c *DecodeConfig) { c.performHook = hook }})
	let := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(let) // before the harness closes the nodes
	key1, key2 := h.open(1, 1), h.open(2, 1)
	if !h.waitBound(key1, time.Second) || !h.waitBound(key2, time.Second) {
		t.Fatal("rooms not bound")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	aborted := make(chan error, 1)
	go func() { aborted <- h.dec.Abort(ctx, 1, "") }()
	select {
	case <-entered:
	case <-time.After(5 * time.Second):
		t.Fatal("room 1's abort never reached its fence")
	}

	returned := make(chan struct{})
	go func() {
		defer close(returned)
		h.dec.OnProgress(key2)
		h.dec.OnRankDone(key2, 0)
		h.dec.Fenced(key1)
	}()
	select {
	case <-returned:
	case <-time.After(5 * time.Second):
		t.Fatal("a data-plane callback waited for the busy owner")
	}
	let()
	if err := <-aborted; err != nil {
		t.Fatalf("Abort: %v", err)
	}
	if _, ok := h.until(tBound, func() bool { return h.bothTerminal(2) }); !ok {
		t.Fatalf("room 2: prefill %v decode %v", h.preState(2), h.decState(2))
	}
	h.expect(1, poll.Failed, poll.Failed)
	h.expect(2, poll.Success, poll.Success)
}
