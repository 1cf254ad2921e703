package conn

import (
	"sort"
	"sync"
	"time"
)

// Clock is the time source of a node and of MemNetwork: the real clock in
// the daemons, FakeClock in tests, so protocol scenarios are deterministic.
type Clock interface {
	Now() time.Time
	// NewTicker ticks every d. The receiver of a tick calls Ticker.Done
	// once it has handled it (FakeClock.Advance waits for that).
	NewTicker(d time.Duration) Ticker
	// AfterFunc runs f once after d (FakeClock: inside Advance).
	AfterFunc(d time.Duration, f func()) Timer
}

// Ticker is a Clock's ticker.
type Ticker interface {
	C() <-chan time.Time
	// Done reports that the last tick received from C was handled.
	Done()
	Stop()
}

// Timer is a Clock's one-shot timer.
type Timer interface {
	// Stop prevents the timer from firing; it reports whether it did.
	Stop() bool
}

// RealClock is the wall clock.
type RealClock struct{}

// Now implements Clock.
func (RealClock) Now() time.Time { return time.Now() }

// NewTicker implements Clock.
func (RealClock) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

// AfterFunc implements Clock.
func (RealClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time { return r.t.C }
func (realTicker) Done()                 {}
func (r realTicker) Stop()               { r.t.Stop() }

// FakeClock is a manual Clock for tests. Advance moves time forward, runs
// due AfterFunc callbacks in its own goroutine, in time order, and delivers
// due ticks, waiting until each was handled (Ticker.Done) or its ticker
// stopped. Ticks do not pile up: a ticker more than one period behind gets
// one tick, like time.Ticker.
type FakeClock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*fakeTimer
	tickers []*fakeTicker
}

// NewFakeClock returns a FakeClock at start.
func NewFakeClock(start time.Time) *FakeClock { return &FakeClock{now: start} }

// Now implements Clock.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// NewTicker implements Clock.
func (c *FakeClock) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("conn: FakeClock.NewTicker: non-positive interval")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTicker{c: make(chan time.Time), done: make(chan struct{}, 1), stop: make(chan struct{}), period: d, next: c.now.Add(d)}
	c.tickers = append(c.tickers, t)
	return t
}

// AfterFunc implements Clock.
func (c *FakeClock) AfterFunc(d time.Duration, f func()) Timer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{clock: c, at: c.now.Add(d), f: f}
	c.timers = append(c.timers, t)
	return t
}

// AfterFuncAt runs f once the clock reaches t, at once (on the caller's
// goroutine) if it already has. A caller that computes d = t - Now() for
// AfterFunc arms late by whatever a test advanced in between.
func (c *FakeClock) AfterFuncAt(t time.Time, f func()) Timer {
	c.mu.Lock()
	tm := &fakeTimer{clock: c, at: t, f: f}
	if t.After(c.now) {
		c.timers = append(c.timers, tm)
		c.mu.Unlock()
		return tm
	}
	c.mu.Unlock()
	f()
	return tm // not queued: Stop reports false
}

// Advance moves the clock forward by d (see FakeClock).
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	end := c.now.Add(d)
	c.mu.Unlock()
	for {
		c.mu.Lock()
		// Earliest timer due by end.
		sort.SliceStable(c.timers, func(i, j int) bool { return c.timers[i].at.Before(c.timers[j].at) })
		if len(c.timers) > 0 && !c.timers[0].at.After(end) {
			t := c.timers[0]
			c.timers = c.timers[1:]
			if t.at.After(c.now) {
				c.now = t.at
			}
			c.mu.Unlock()
			t.f()
			continue
		}
		c.now = end
		var due []*fakeTicker
		live := c.tickers[:0]
		for _, t := range c.tickers {
			select {
			case <-t.stop:
				continue
			default:
			}
			live = append(live, t)
			if !t.next.After(end) {
				for !t.next.After(end) {
					t.next = t.next.Add(t.period)
				}
				due = append(due, t)
			}
		}
		c.tickers = live
		c.mu.Unlock()
		for _, t := range due {
			t.deliver(end)
		}
		return
	}
}

type fakeTimer struct {
	clock *FakeClock
	at    time.Time
	f     func()
}

func (t *fakeTimer) Stop() bool {
	c := t.clock
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, x := range c.timers {
		if x == t {
			c.timers = append(c.timers[:i], c.timers[i+1:]...)
			return true
		}
	}
	return false
}

type fakeTicker struct {
	c        chan time.Time
	done     chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	period   time.Duration
	next     time.Time // guarded by the clock's mu
}

// deliver hands one tick to the ticker's reader and waits until it is
// handled or the ticker is stopped.
func (t *fakeTicker) deliver(now time.Time) {
	select {
	case t.c <- now:
	case <-t.stop:
		return
	}
	select {
	case <-t.done:
	case <-t.stop:
	}
}

func (t *fakeTicker) C() <-chan time.Time { return t.c }

func (t *fakeTicker) Done() {
	select {
	case t.done <- struct{}{}:
	default:
	}
}

func (t *fakeTicker) Stop() { t.stopOnce.Do(func() { close(t.stop) }) }
