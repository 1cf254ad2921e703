package room

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/poll"
)

// endLog records what a node's Ended hook hears.
type endLog struct {
	mu   sync.Mutex
	ends map[poll.Key][]RoomEnd
}

func (l *endLog) add(e RoomEnd) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ends[e.Key] = append(l.ends[e.Key], e)
}

// one returns the room's only end, failing the test when it heard none or
// more than one.
func (l *endLog) one(t *testing.T, side string, room poll.RoomID) RoomEnd {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []RoomEnd
	for k, es := range l.ends {
		if k.Room == room {
			out = append(out, es...)
		}
	}
	if len(out) != 1 {
		t.Fatalf("%s room %d: Ended heard %d times (%v), want once", side, room, len(out), out)
	}
	return out[0]
}

func (l *endLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, es := range l.ends {
		n += len(es)
	}
	return n
}

// The Ended hook hears every room that ends, once, with its life and its
// transfer time, while a subscription nobody reads (the kind the duration
// histograms used to hang on) holds 4 transitions and drops the rest.
func TestEndedHearsEveryRoomWhileAnUnreadSubscriptionDrops(t *testing.T) {
	pre, dec := &endLog{ends: map[poll.Key][]RoomEnd{}}, &endLog{ends: map[poll.Key][]RoomEnd{}}
	h := newHarnessWith(t, 28, options{
		pre: func(c *PrefillConfig) { c.Ended = pre.add },
		dec: func(c *DecodeConfig) { c.Ended = dec.add },
	})
	const buf = 4
	preSub, decSub := h.pre.Subscribe(buf), h.dec.Subscribe(buf)
	defer preSub.Close()
	defer decSub.Close()

	// Successes: decode's transfer takes 100ms of virtual time from its
	// first byte.
	const transfer = 100 * time.Millisecond
	var successes []poll.Key
	for r := poll.RoomID(1); r <= 8; r++ {
		key := h.open(r, 1)
		if !h.waitBound(key, tBound) {
			t.Fatalf("room %d never bound", r)
		}
		_ = h.pre.FirstSend(r)
		h.dec.OnProgress(key)
		h.advance(transfer)
		h.dec.OnRankDone(key, 0)
		if _, ok := h.until(tBound, func() bool { return h.bothTerminal(r) }); !ok {
			t.Fatalf("room %d pinned", r)
		}
		successes = append(successes, key)
	}
	// Prefill rooms no decode ever asks for time out in Bootstrapping;
	// decode rooms are aborted by their scheduler.
	for r := poll.RoomID(101); r <= 110; r++ {
		if _, err := h.pre.Open(r, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	for r := poll.RoomID(201); r <= 210; r++ {
		h.openDecode(r, 1)
		if err := h.dec.Abort(context.Background(), r, ""); err != nil {
			t.Fatal(err)
		}
	}
	h.advance(tBoot + 2*tTick)

	for _, key := range successes {
		if e := dec.one(t, "decode", key.Room); e.To != poll.Success || e.Transfer != transfer || e.Life < transfer {
			t.Errorf("decode room %d: %+v, want Success with a transfer of %v", key.Room, e, transfer)
		}
		// Prefill's Success waits for decode's STATUS, a tick or so later.
		if e := pre.one(t, "prefill", key.Room); e.To != poll.Success || e.Transfer < transfer || e.Transfer > transfer+tBound || e.Life < e.Transfer {
			t.Errorf("prefill room %d: %+v, want Success with a transfer of at least %v", key.Room, e, transfer)
		}
	}
	for r := poll.RoomID(101); r <= 110; r++ {
		e := pre.one(t, "prefill", r)
		if e.To != poll.Failed || e.Reason != poll.ReasonTimeoutBootstrapping || e.Life < tBoot || e.Life > tBoot+2*tTick || e.Transfer != 0 {
			t.Errorf("prefill room %d: %+v, want Failed by its bootstrap timeout after %v", r, e, tBoot)
		}
	}
	for r := poll.RoomID(201); r <= 210; r++ {
		if e := dec.one(t, "decode", r); e.To != poll.Failed || e.Reason != poll.ReasonAbortedLocal || e.Transfer != 0 {
			t.Errorf("decode room %d: %+v, want Failed aborted:local", r, e)
		}
	}
	if n := pre.count(); n != 18 {
		t.Errorf("prefill: Ended heard %d ends, want 18 rooms", n)
	}
	if n := dec.count(); n != 18 {
		t.Errorf("decode: Ended heard %d ends, want 18 rooms", n)
	}
	// The unread subscriptions kept buf transitions each: a feed hanging
	// on them would have seen at most buf of the 18 ends.
	for side, sub := range map[string]*Subscription{"prefill": preSub, "decode": decSub} {
		if len(sub.C()) != buf || sub.Dropped() < 18 {
			t.Errorf("%s: subscription holds %d and dropped %d, want %d held and the ends among the dropped", side, len(sub.C()), sub.Dropped(), buf)
		}
	}
}
