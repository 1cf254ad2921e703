package room

import (
	"fmt"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

// The owner goroutine (docs/history/room-PLAN.md section 1, etcd raft's node.run): one per
// node, from construction until the node stops, the only goroutine that
// touches the table and the per-room state beside it while it runs. Every
// input reaches it through one FIFO queue: scheduler calls are requests
// whose caller waits for the reply (at most for the owner's CPU: the owner
// never waits, a fence included); a link's room frames are handed over
// with an ack token and nobody waits for them (deliver: the owner sends
// the ACK as the input's last effect, so a socket reader never waits for
// a busy owner); ticks, lost peers and data-plane callbacks are events
// nobody waits for (a transfer goroutine that calls back while it holds a
// lock of its own must not wait for an owner that may be asking that data
// plane to fence). Each input steps the table,
// publishes the visible transitions to Watch and performs the effects in
// table order, all on the owner goroutine; so a room's transitions reach
// every subscriber in the order the table made them.
//
// Once the owner stopped (Close), the inputs still run, on their callers'
// goroutines one at a time (owner.inline), as before the owner: a closed
// node still answers Poll and Get. A room frame is not: its token is
// cancelled unanswered, as by a crashed node (the peer retransmits).

// ownerState is where the owner goroutine is in its life.
type ownerState int32

const (
	ownerRunning  ownerState = iota // inputs are queued to the owner goroutine
	ownerStopping                   // stop asked: the queue is drained, then the owner exits
	ownerStopped                    // the owner exited: inputs run on their callers
)

// input is one queued input: fn runs on the owner goroutine; done, if
// set, is closed after it (the caller waits on it).
type input struct {
	fn   func()
	done chan struct{}
	// cancel, if set, runs if fn panicked (a link frame: its ACK token
	// goes back unanswered, so the peer's retransmit is stepped again).
	cancel func()
	// panicked is what fn panicked with, re-raised on the caller.
	panicked any
}

// owner is the queue and the life of the owner goroutine.
type owner struct {
	mu    sync.Mutex // guards queue, state changes and busy
	queue []*input
	busy  bool // the owner is running an input now
	state atomic.Int32
	wake  chan struct{} // 1-buffered: the queue is not empty
	// exited is closed when the owner goroutine returned.
	exited chan struct{}
	// progressQueued are the rooms with a progress event in the queue
	// (guarded by mu): a room's next progress coalesces into it.
	progressQueued map[poll.Key]struct{}
	// progressDropped counts the progress events coalesced or dropped.
	progressDropped atomic.Uint64
	// tickQueued: a tick is in the queue (guarded by mu); the next one
	// coalesces into it (it reads the clock when it runs).
	tickQueued bool
	// inline serialises the inputs that run on their callers once the
	// owner stopped, so the per-room state beside the table (the data
	// plane's bindings and metadata) still has one writer at a time.
	inline sync.Mutex
}

func newOwner() *owner {
	return &owner{wake: make(chan struct{}, 1), exited: make(chan struct{}), progressQueued: map[poll.Key]struct{}{}}
}

// maxQueuedInputs bounds the queue a progress event may join: past it the
// owner is that far behind, and a progress (which only refreshes a room's
// idle deadline) is dropped and counted rather than queued.
const maxQueuedInputs = 1 << 16

// withTable runs fn with the table to itself. While the owner runs, only
// its inputs reach the table, so c.mu is never contended; it makes the
// table safe once the owner stopped and inputs run on their callers.
func (c *core) withTable(fn func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	fn()
}

// enqueue queues fn for the owner; false: the owner stopped, the caller
// runs it.
func (c *core) enqueue(in *input) bool {
	o := c.own
	o.mu.Lock()
	if ownerState(o.state.Load()) == ownerStopped {
		o.mu.Unlock()
		return false
	}
	o.queue = append(o.queue, in)
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
	return true
}

// exec runs fn on the owner goroutine and returns once it ran (fn writes
// its results into the caller's variables). A panic in fn is re-raised
// here, on the caller, as it was before the owner.
func (c *core) exec(fn func()) {
	in := &input{fn: fn, done: make(chan struct{})}
	if !c.enqueue(in) {
		c.own.inline.Lock()
		defer c.own.inline.Unlock()
		fn()
		return
	}
	<-in.done
	if in.panicked != nil {
		panic(in.panicked)
	}
}

// execOwned runs fn on the owner goroutine and returns true once it ran;
// false, without running fn, once the owner stopped (a Send to a closed
// node takes nothing).
func (c *core) execOwned(fn func()) bool {
	in := &input{fn: fn, done: make(chan struct{})}
	if !c.enqueue(in) {
		return false
	}
	<-in.done
	if in.panicked != nil {
		panic(in.panicked)
	}
	return true
}

// post queues fn for the owner without waiting (data-plane callbacks).
func (c *core) post(fn func()) {
	if !c.enqueue(&input{fn: fn}) {
		c.own.inline.Lock()
		defer c.own.inline.Unlock()
		fn()
	}
}

// postProgress queues a data-plane progress event for key without
// waiting, at most one per room: the data-plane callback queue is bounded
// by the rooms, never by the pieces that land. A progress for a room that
// has one queued is coalesced into it (that one refreshes the same
// deadline when it runs), and one that finds the queue at
// maxQueuedInputs is dropped; both are counted (ProgressDropped). Events
// that change a room's state (done, failed, fenced) are never dropped.
func (c *core) postProgress(key poll.Key, fn func()) {
	o := c.own
	c.postCoalesced(func() bool {
		if _, queued := o.progressQueued[key]; queued || len(o.queue) >= maxQueuedInputs {
			o.progressDropped.Add(1)
			return false
		}
		o.progressQueued[key] = struct{}{}
		return true
	}, func() { delete(o.progressQueued, key) }, fn)
}

// postCoalesced queues fn without waiting if admit, run under the queue's
// lock, takes it; unmark runs under that lock just before fn, so an event
// landing while fn waits is coalesced and one landing after unmark is
// queued again. After the owner stopped, fn runs as any post does.
func (c *core) postCoalesced(admit func() bool, unmark func(), fn func()) {
	o := c.own
	o.mu.Lock()
	if ownerState(o.state.Load()) == ownerStopped {
		o.mu.Unlock()
		c.post(fn)
		return
	}
	if !admit() {
		o.mu.Unlock()
		return
	}
	o.queue = append(o.queue, &input{fn: func() {
		o.mu.Lock()
		unmark()
		o.mu.Unlock()
		fn()
	}})
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// deliver queues a link's room frame for the owner without waiting:
// step runs on the owner goroutine and returns the frame's answer, which
// the owner sends as the input's last effect (Link.Ack), after the effects
// of the step; a panic in step gives the token back unanswered. false:
// the owner stopped and takes no frames (the link cancels the token: the
// peer retransmits, as to a crashed node).
func (c *core) deliver(tok *conn.AckToken, step func() conn.AckResult) bool {
	return c.enqueue(&input{
		fn:     func() { c.lk.Ack(tok, step()) },
		cancel: func() { c.lk.Cancel(tok) },
	})
}

// postTick queues the owner's part of a tick (deadlines, fence retries)
// without waiting, at most one at a time: the tick worker goes on with
// retransmits and heartbeats however busy the owner is.
func (c *core) postTick(fn func()) {
	o := c.own
	c.postCoalesced(func() bool {
		if o.tickQueued {
			return false
		}
		o.tickQueued = true
		return true
	}, func() { o.tickQueued = false }, fn)
}

// ProgressDropped is how many data-plane progress events were coalesced
// into one already queued for their room, or dropped with the owner's
// queue full.
func (c *core) ProgressDropped() uint64 { return c.own.progressDropped.Load() }

// runOwner is the owner goroutine: it runs the queued inputs in order
// until stop is asked and the queue is empty.
func (c *core) runOwner() {
	o := c.own
	defer close(o.exited)
	for {
		o.mu.Lock()
		batch := o.queue
		o.queue = nil
		if len(batch) == 0 && ownerState(o.state.Load()) == ownerStopping {
			o.state.Store(int32(ownerStopped))
			o.mu.Unlock()
			return
		}
		o.busy = len(batch) > 0
		o.mu.Unlock()
		for _, in := range batch {
			if in.cancel != nil && ownerState(o.state.Load()) == ownerStopping {
				// A link frame not stepped before the stop: its token
				// goes back unanswered, as from a crashed node, and the
				// peer retransmits to our next incarnation or gives up.
				in.cancel()
				continue
			}
			c.runInput(in)
		}
		if len(batch) > 0 {
			o.mu.Lock()
			o.busy = false
			o.mu.Unlock()
			continue
		}
		<-o.wake
	}
}

// runInput runs one input; a panic is handed to the waiting caller, or
// logged and counted for an event nobody waits for.
func (c *core) runInput(in *input) {
	defer func() {
		if p := recover(); p != nil {
			if in.cancel != nil {
				in.cancel()
			}
			if in.done != nil {
				in.panicked = p
			} else {
				c.lk.CountWorkerRestart()
				c.log.Error("owner input panicked", zap.String("panic", fmt.Sprint(p)))
			}
		}
		if in.done != nil {
			close(in.done)
		}
	}()
	in.fn()
}

// stopOwner lets the owner run what is queued (link frames excepted:
// their tokens are cancelled), then stop; later inputs run on their
// callers.
func (c *core) stopOwner() {
	o := c.own
	o.mu.Lock()
	if ownerState(o.state.Load()) == ownerRunning {
		o.state.Store(int32(ownerStopping))
	}
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
	<-o.exited
}

// ownerIdle reports whether nothing is queued for the owner and it runs
// nothing (tests: the script harness waits for it before tracing).
func (c *core) ownerIdle() bool {
	o := c.own
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.queue) == 0 && !o.busy
}
