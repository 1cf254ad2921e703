package room

import (
	"context"

	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

// Fences never wait on a node goroutine. A Fence effect asks the data
// plane to stop the room's worker; the data plane answers done at once
// when no worker holds the room, or later through Fenced once the worker
// let go. Only then is EvFenced stepped, so the room stays
// Failed-but-invisible until no worker touches its pages (I9), while the
// socket readers, the tick loop and every other room go on.

// fenceState is a room whose fence the data plane has not reported done.
type fenceState struct {
	// retry: the data plane's Fence panicked; the tick loop calls it again.
	retry bool
	// then runs once the room is fenced (the ABORT_ACK of a peer's ABORT).
	then []func()
}

// fenceRoom asks the data plane to fence the room. When it is done at
// once, it steps EvFenced and returns the effects (the Publish). A data
// plane that panics is recovered and counted; the room is marked for a
// retry on tick, so its Failed state is published once the fence works
// and never before (I9).
func (c *core) fenceRoom(k poll.Key) []poll.Effect {
	c.fenceMu.Lock()
	f := c.fences[k]
	if f == nil {
		// Registered before the call: the data plane may report Fenced
		// from another goroutine before Fence returns.
		f = &fenceState{}
		c.fences[k] = f
	}
	f.retry = false
	c.fenceMu.Unlock()
	done, ok := c.callFence(k)
	if !ok {
		c.fenceMu.Lock()
		if c.fences[k] == f {
			f.retry = true
		}
		c.fenceMu.Unlock()
		return nil
	}
	if !done {
		return nil
	}
	return c.finishFence(k)
}

// callFence calls the data plane's Fence; ok is false if it panicked.
func (c *core) callFence(k poll.Key) (done, ok bool) {
	defer func() {
		if p := recover(); p != nil {
			c.lk.CountWorkerRestart()
			c.log.Error("data plane fence panicked, will retry", conn.RoomField(k), zap.Any("panic", p))
			done, ok = false, false
		}
	}()
	return c.hooks.fence(k), true
}

// finishFence steps EvFenced for a room whose fence is in progress and
// runs what waited for it; a second report for the same fence, or one for
// a room with no fence in progress, does nothing.
func (c *core) finishFence(k poll.Key) []poll.Effect {
	c.fenceMu.Lock()
	f := c.fences[k]
	delete(c.fences, k)
	c.fenceMu.Unlock()
	if f == nil {
		return nil
	}
	var effs []poll.Effect
	c.withTable(func() {
		_ = c.t.Step(c.now(), poll.Event{Kind: poll.EvFenced, Key: k})
		effs = c.takeLocked()
	})
	for _, fn := range f.then {
		fn()
	}
	return effs
}

// Fenced is the data plane's report that the fence it answered "not done"
// for key has completed: no worker reads or writes the room's pages any
// more. The room's Failed state becomes visible and is published, and the
// calls waiting for it return. Safe from any goroutine and idempotent; a
// key with no fence in progress (unknown, already fenced, or gone) is
// ignored. It never waits: the report is an event for the owner.
func (c *core) Fenced(key poll.Key) { c.post(func() { c.perform(c.finishFence(key)) }) }

// retryFences calls Fence again for the rooms whose fence panicked (an
// input of the owner: the tick).
func (c *core) retryFences() {
	c.fenceMu.Lock()
	var keys []poll.Key
	for k, f := range c.fences {
		if f.retry {
			keys = append(keys, k)
		}
	}
	c.fenceMu.Unlock()
	for _, k := range keys {
		c.perform(c.fenceRoom(k))
	}
}

// dropFence forgets a fence still in progress for a room that left the
// table (reaped): a late Fenced for it is ignored.
func (c *core) dropFence(k poll.Key) {
	c.fenceMu.Lock()
	delete(c.fences, k)
	c.fenceMu.Unlock()
}

// afterFence runs fn once the room's fence in progress is done, or now if
// none is in progress.
func (c *core) afterFence(k poll.Key, fn func()) {
	c.fenceMu.Lock()
	if f := c.fences[k]; f != nil {
		f.then = append(f.then, fn)
		c.fenceMu.Unlock()
		return
	}
	c.fenceMu.Unlock()
	fn()
}

// parkedCall is a call (Abort, AwaitFailedVisible) waiting for its room's
// Failed to become visible.
// Its fields are the owner's (guarded by withTable).
type parkedCall struct {
	woken   chan struct{}
	done    bool // woken closed
	counted bool // in parkedCalls
	// admission is the caller's ctx of a last Send waiting for its room's
	// admission (nil for the other calls): the room's admitted event wakes
	// only these, with admitted set, and a wait whose ctx ended is leaving.
	admission context.Context
	admitted  bool
	// rank is the prefill rank whose last Send waits (its stream's
	// admission wakes it, not another rank's).
	rank uint16
}

// abort fails a room locally and parks the caller until the room's Failed
// state is visible (its fence done), the room left the table, the node
// stopped or ctx ended (then ctx's error: the abort stands and the room's
// Failed shows once fenced). A call that finds the room already Failed
// returns at once with poll.ErrTerminal, whatever the scheduler sees.
func (c *core) abort(ctx context.Context, room poll.RoomID, reason poll.Reason) error {
	return c.abortThen(ctx, room, reason, nil)
}

// abortThen is abort that also runs failed (if not nil) in the owner input
// that failed the room, when this call did: what counts the room then
// counts it in order with the other inputs (a register's retire).
func (c *core) abortThen(ctx context.Context, room poll.RoomID, reason poll.Reason, failed func()) error {
	var err error
	var p *parkedCall
	var key poll.Key
	c.exec(func() {
		c.applyOwned(func() {
			err = c.t.Step(c.now(), poll.Event{Kind: poll.EvAbortLocal, Key: poll.Key{Room: room}, Reason: reason})
			if err == nil && failed != nil {
				failed()
			}
			if err == nil {
				if in, gerr := c.t.Get(room); gerr == nil && in.State == poll.Failed && !in.Fenced {
					// Parked before the effects run: the fence may be done
					// (and Failed published) before perform returns.
					p, key = &parkedCall{woken: make(chan struct{})}, in.Key
					c.parked[key] = append(c.parked[key], p)
				}
			}
		})
		if p != nil {
			c.withTable(func() {
				if !p.done {
					p.counted = true
					c.parkedCalls.Add(1)
				}
			})
		}
	})
	if p == nil {
		return err
	}
	return c.waitParked(ctx, key, p)
}

// AwaitFailedVisible waits while room is Failed but not yet visibly so
// (its fence not done), until the fence is done, the room left the table,
// the node stopped (ErrClosedNode) or ctx ended (ctx's error). A room in
// any other state returns at once. A call that learns its room ended (a
// Send whose transfer the fence refused) answers with the state the
// scheduler will read, not the hidden one.
func (c *core) AwaitFailedVisible(ctx context.Context, room poll.RoomID) error {
	var p *parkedCall
	var key poll.Key
	c.exec(func() {
		c.withTable(func() {
			in, err := c.t.Get(room)
			if err != nil || in.State != poll.Failed || in.Fenced {
				return
			}
			p, key = &parkedCall{woken: make(chan struct{}), counted: true}, in.Key
			c.parked[key] = append(c.parked[key], p)
			c.parkedCalls.Add(1)
		})
	})
	if p == nil {
		return nil
	}
	return c.waitParked(ctx, key, p)
}

// waitParked waits for a parked call to be woken, its ctx to end or the
// node to stop.
func (c *core) waitParked(ctx context.Context, key poll.Key, p *parkedCall) error {
	select {
	case <-p.woken:
		return nil
	case <-ctx.Done():
		c.unpark(key, p)
		return ctx.Err()
	case <-c.halted:
		c.unpark(key, p)
		return conn.ErrClosedNode
	}
}

// unparkLocked wakes every call parked on k.
func (c *core) unparkLocked(k poll.Key) {
	for _, p := range c.parked[k] {
		p.done = true
		if p.counted {
			p.counted = false
			c.parkedCalls.Add(-1)
		}
		close(p.woken)
	}
	delete(c.parked, k)
}

// unpark removes a parked call that stopped waiting (ctx ended, node
// stopped) unless it was woken meanwhile.
func (c *core) unpark(k poll.Key, p *parkedCall) {
	c.exec(func() { c.withTable(func() { c.unparkOwned(k, p) }) })
}

func (c *core) unparkOwned(k poll.Key, p *parkedCall) {
	if p.done {
		return
	}
	p.done = true
	if p.counted {
		p.counted = false
		c.parkedCalls.Add(-1)
	}
	list := c.parked[k]
	for i, x := range list {
		if x == p {
			list = append(list[:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(c.parked, k)
	} else {
		c.parked[k] = list
	}
}
