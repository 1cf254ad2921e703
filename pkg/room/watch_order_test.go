package room

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/poll"
)

// Issue 12: Watch delivers each room's transitions in the order the table
// made them, whichever goroutine stepped them. One goroutine moves the room
// to Transferring and is then delayed between the table lock and the rest
// of its effects (performHook, as a loaded machine would deschedule it);
// meanwhile another goroutine aborts the room, whose Failed becomes visible
// at once (the fence is done). A subscriber must still see
// WaitingForInput -> Transferring before Transferring -> Failed: this fails
// when transitions are published after the table lock is released.
func TestWatchSeesEachRoomsTransitionsInTableOrder(t *testing.T) {
	for _, side := range []string{"prefill", "decode"} {
		t.Run(side, func(t *testing.T) {
			delayed := make(chan struct{})
			release := make(chan struct{})
			var once sync.Once
			hook := func(effs []poll.Effect) {
				for _, e := range effs {
					if e.Kind == poll.EffTransition && e.Key.Room == 1 && e.To == poll.Transferring {
						once.Do(func() {
							close(delayed)
							<-release
						})
					}
				}
			}
			o := options{pre: func(c *PrefillConfig) { c.performHook = hook }}
			if side == "decode" {
				o = options{dec: func(c *DecodeConfig) { c.performHook = hook }}
			}
			h := newHarnessWith(t, 41, o)
			released := false
			t.Cleanup(func() {
				if !released {
					close(release)
				}
			})
			key := h.open(1, 1)
			if !h.waitBound(key, time.Second) {
				t.Fatal("room not bound")
			}
			h.expect(1, poll.WaitingForInput, poll.WaitingForInput)
			var owner interface {
				Subscribe(int) *Subscription
				Abort(context.Context, poll.RoomID, poll.Reason) error
			} = h.pre
			moveOn := func() { _ = h.pre.FirstSend(1) }
			if side == "decode" {
				owner = h.dec
				moveOn = func() { h.dec.OnProgress(key) }
			}
			sub := owner.Subscribe(64)
			defer sub.Close()

			moved := make(chan struct{})
			go func() {
				defer close(moved)
				moveOn()
			}()
			select {
			case <-delayed:
			case <-time.After(5 * time.Second):
				t.Fatal("the move to Transferring never reached its effects")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := owner.Abort(ctx, 1, ""); err != nil {
				t.Fatalf("Abort: %v", err)
			}
			released = true
			close(release)
			<-moved

			var got []Transition
			for len(got) < 2 {
				select {
				case tr := <-sub.C():
					if tr.Key.Room == 1 {
						got = append(got, tr)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("only %d transitions of room 1 published: %+v", len(got), got)
				}
			}
			if got[0].From != poll.WaitingForInput || got[0].To != poll.Transferring ||
				got[1].From != poll.Transferring || got[1].To != poll.Failed {
				t.Fatalf("Watch saw %v -> %v, then %v -> %v; want WaitingForInput -> Transferring, then Transferring -> Failed",
					got[0].From, got[0].To, got[1].From, got[1].To)
			}
			if n := sub.Dropped(); n != 0 {
				t.Fatalf("%d transitions dropped", n)
			}
		})
	}
}

// A slow Watch reader never blocks the node; what it missed is counted.
func TestSlowSubscriberDropsAndCounts(t *testing.T) {
	h := newHarness(t, 40)
	sub := h.pre.Subscribe(1)
	for r := poll.RoomID(1); r <= 5; r++ {
		if _, err := h.pre.Open(r, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	if sub.Dropped() != 4 || h.pre.Counters().WatchDropped != 4 {
		t.Fatalf("dropped %d", sub.Dropped())
	}
	sub.Close()
	if _, ok := <-sub.C(); !ok {
		t.Fatal("buffered transition lost on close")
	}
	if _, ok := <-sub.C(); ok {
		t.Fatal("channel open after Close")
	}
	sub.Close() // idempotent
}
