package room

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/poll"
)

// Issue 12: Watch delivers each room's transitions in the order the table
// made them, because the owner goroutine publishes every one of them,
// whichever goroutine's call or callback caused it. Many goroutines move
// rooms on (FirstSend, OnProgress) and abort them at once; a subscriber
// must see each room's transitions chained (each From the previous To,
// ending Failed), all published from one goroutine. This fails when
// publication leaves the owner goroutine (a caller publishing what its
// input made, as the table-lock owners before it did).
func TestWatchSeesEachRoomsTransitionsInTableOrder(t *testing.T) {
	const rooms = 40
	for _, side := range []string{"prefill", "decode"} {
		t.Run(side, func(t *testing.T) {
			var pubMu sync.Mutex
			publishers := map[string]int{}
			hook := func(Transition) {
				id := goroutineID()
				pubMu.Lock()
				publishers[id]++
				pubMu.Unlock()
			}
			o := options{pre: func(c *PrefillConfig) { c.publishHook = hook }}
			if side == "decode" {
				o = options{dec: func(c *DecodeConfig) { c.publishHook = hook }}
			}
			h := newHarnessWith(t, 41, o)
			keys := make([]poll.Key, rooms)
			for i := range keys {
				keys[i] = h.open(poll.RoomID(i+1), 1)
			}
			for _, k := range keys {
				if !h.waitBound(k, time.Second) {
					t.Fatalf("room %d not bound", k.Room)
				}
			}
			for _, k := range keys {
				h.expect(k.Room, poll.WaitingForInput, poll.WaitingForInput)
			}
			var owner interface {
				Subscribe(int) *Subscription
				Abort(context.Context, poll.RoomID, poll.Reason) error
			} = h.pre
			moveOn := func(k poll.Key) { _ = h.pre.FirstSend(k.Room) }
			if side == "decode" {
				owner = h.dec
				moveOn = func(k poll.Key) { h.dec.OnProgress(k) }
			}
			sub := owner.Subscribe(4 * rooms)
			defer sub.Close()
			pubMu.Lock()
			clear(publishers)
			pubMu.Unlock()

			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			for _, k := range keys {
				wg.Add(2)
				go func() { defer wg.Done(); moveOn(k) }()
				go func() { defer wg.Done(); _ = owner.Abort(ctx, k.Room, "") }()
			}
			wg.Wait()

			last := map[poll.RoomID]poll.State{}
			for _, k := range keys {
				last[k.Room] = poll.WaitingForInput
			}
			failed := 0
			for failed < rooms {
				select {
				case tr := <-sub.C():
					prev, ok := last[tr.Key.Room]
					if !ok {
						continue
					}
					if tr.From != prev {
						t.Fatalf("room %d: Watch saw %v -> %v after a transition to %v", tr.Key.Room, tr.From, tr.To, prev)
					}
					last[tr.Key.Room] = tr.To
					if tr.To == poll.Failed {
						failed++
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("%d of %d rooms published Failed: %v", failed, rooms, last)
				}
			}
			if n := sub.Dropped(); n != 0 {
				t.Fatalf("%d transitions dropped", n)
			}
			pubMu.Lock()
			defer pubMu.Unlock()
			if len(publishers) != 1 {
				t.Fatalf("transitions published from %d goroutines, want one: the owner's", len(publishers))
			}
		})
	}
}

// goroutineID is the running goroutine's id, read from its stack header
// ("goroutine 17 [running]:").
func goroutineID() string {
	var buf [64]byte
	n := runtime.Stack(buf[:], false)
	f := strings.Fields(string(buf[:n]))
	if len(f) < 2 {
		return ""
	}
	return f[1]
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
