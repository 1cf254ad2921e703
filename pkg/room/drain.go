package room

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

// A drain is a planned stop that lets every scheduler see how each of its
// rooms ended (docs/history/room-PLAN.md section 7). Rooms keep finishing until the deadline;
// then the live ones fail with shutdown, and the node keeps answering
// Poll, Get and Watch until each of those is visible and has been visible
// for the terminal grace (a scheduler polling every 10 ms looks 30 times
// in the default 300 ms), while the link retries the notices to the peers.
// Only then does it say goodbye. Everything is bounded by the plan's cap,
// so a fence that never completes or a peer that never answers costs
// time up to the cap and no more.

// goodbyeReserve is the part of the cap kept for GOODBYE and its ACKs.
const goodbyeReserve = 100 * time.Millisecond

// drainBuffer is the drain's own subscription buffer beyond one
// transition per live room: a dropped transition only costs a Poll of the
// rooms still awaited.
const drainBuffer = 4096

// DrainPlan says when a drain's phases end, on the node's clock.
type DrainPlan struct {
	// Deadline is when the rooms still live fail with shutdown (SIGTERM
	// plus --drain-timeout).
	Deadline time.Time
	// TerminalGrace is how long a room that ended during the drain stays
	// pollable before the drain may end.
	TerminalGrace time.Duration
	// Cap is when Drain returns whatever is still pending.
	Cap time.Time
}

// DrainReport says how a drain went.
type DrainReport struct {
	// Ended counts the rooms that ended before the deadline.
	Ended int
	// Failed counts the rooms failed with shutdown at the deadline.
	Failed int
	// Invisible counts the rooms still not visible as terminal when the
	// drain ended (their fence had not completed).
	Invisible int
	// UnackedNotices counts the room notices no peer had acknowledged.
	UnackedNotices int
	// Capped says the drain ended at its cap, not because all was done.
	Capped bool
}

// Drain runs a drain to plan and says goodbye to the peers (see the
// comment at the top of drain.go). The caller refuses new rooms first.
// It returns by p.Cap or when ctx ends; a fence still running then goes
// on in the background. Close afterwards stops the node.
func (c *core) Drain(ctx context.Context, p DrainPlan) DrainReport {
	start := c.clock.Now()
	// Room for every live room's Failed on top: no new room comes in, and
	// 100k of them published in a burst at the deadline would otherwise
	// overflow it on every batch, and each overflow costs a Poll of every
	// room still awaited under the table lock the fences need.
	sub := c.subscribe(drainBuffer + c.Stats().Inflight)
	defer sub.Close()
	w := &drainWatch{c: c, sub: sub, pending: make(map[poll.Key]struct{})}

	capCtx, cancelCap := context.WithCancel(ctx)
	defer cancelCap()
	defer c.atDo(p.Cap, cancelCap)()
	waitCtx, cancelWait := context.WithCancel(capCtx)
	defer cancelWait()
	defer c.atDo(p.Cap.Add(-goodbyeReserve), cancelWait)()

	inflight := c.Stats().Inflight
	c.log.Info("drain started", zap.Int("inflight", inflight),
		zap.Duration("until_deadline", p.Deadline.Sub(start)), zap.Duration("terminal_grace", p.TerminalGrace))

	var rep DrainReport
	deadline, stopDeadline := c.at(p.Deadline)
	defer stopDeadline()
wait:
	for c.Stats().Inflight > 0 {
		select {
		case tr := <-sub.C():
			w.saw(tr)
		case <-deadline:
			break wait
		case <-waitCtx.Done():
			break wait
		}
	}
	rep.Ended = max(inflight-c.Stats().Inflight, 0)

	failed, performed := c.failLive()
	rep.Failed = len(failed)
	reached := c.clock.Now()
	if rep.Failed > 0 {
		c.log.Info("drain deadline reached", zap.Int("rooms_failed", rep.Failed), zap.Int("rooms_ended", rep.Ended),
			zap.Duration("waited", reached.Sub(start)))
	}
	w.await(failed)

	notices := w.settle(waitCtx, p.TerminalGrace)
	rep.Invisible = len(w.pending)
	rep.UnackedNotices = c.lk.UnackedRoomFrames()
	rep.Capped = waitCtx.Err() != nil
	if notices {
		c.lk.SayGoodbye(capCtx)
	} else {
		// The peers did not acknowledge the notices: they will not answer
		// a goodbye in time either. One try, no wait.
		c.lk.SayGoodbye(doneContext())
	}
	select {
	case <-performed:
	default:
		c.log.Warn("drain ended with a fence still running", zap.Int("rooms_invisible", rep.Invisible))
	}
	end := c.clock.Now()
	c.log.Info("drain finished", zap.Int("rooms_ended", rep.Ended), zap.Int("rooms_failed", rep.Failed),
		zap.Int("rooms_invisible", rep.Invisible), zap.Int("notices_unacknowledged", rep.UnackedNotices),
		zap.Bool("capped", rep.Capped), zap.Duration("took", end.Sub(start)), zap.Duration("after_deadline", end.Sub(reached)))
	return rep
}

// failLive fails every live room with shutdown and returns their keys.
// Its effects (notices, fences, publications) run right after, in the same
// input of the owner, which closes performed when done: the drain does not
// wait for them, so a fence that never completes must not hold the drain
// past its cap.
func (c *core) failLive() (failed []poll.Key, performed <-chan struct{}) {
	done := make(chan struct{})
	keys := make(chan []poll.Key, 1)
	c.post(func() {
		var failed []poll.Key
		handedOn := false
		defer func() {
			select {
			case keys <- failed: // unless sent below (a panic in between)
			default:
			}
			if !handedOn {
				close(done)
			}
		}()
		var effs []poll.Effect
		c.withTable(func() {
			_ = c.t.Step(c.now(), poll.Event{Kind: poll.EvShutdown})
			effs = c.takeLocked()
		})
		for _, e := range effs {
			if e.Kind == poll.EffTransition && e.To == poll.Failed {
				failed = append(failed, e.Key)
			}
		}
		keys <- failed
		c.performInSlices(c.performFencesFirst(effs), done)
		handedOn = true
	})
	return <-keys, done
}

// performInSlices performs effs fenceBatch at a time, each slice its own
// input of the owner, and closes done after the last: the scheduler's
// calls (a Poll reading the Failed states just published) run between
// the slices instead of behind 100k notices, each a link send.
func (c *core) performInSlices(effs []poll.Effect, done chan struct{}) {
	n := min(fenceBatch, len(effs))
	head, tail := effs[:n], effs[n:]
	c.post(func() {
		handedOn := false
		defer func() {
			if !handedOn {
				close(done)
			}
		}()
		c.perform(head)
		if len(tail) > 0 {
			c.performInSlices(tail, done)
			handedOn = true
		}
	})
}

// performFencesFirst performs a batch that fails many rooms at once (the
// drain deadline's, 100k rooms) with their fences first: the rooms whose
// fence is done at once are stepped EvFenced under one table lock, so they
// turn visible together instead of each behind the notices of the rooms
// before it (each notice is a link send), and it returns the notices and
// the rest, in order, for the caller to perform.
func (c *core) performFencesFirst(effs []poll.Effect) (rest []poll.Effect) {
	rest = make([]poll.Effect, 0, len(effs))
	fenced := make([]*fenceState, 0, fenceBatch)
	keys := make([]poll.Key, 0, fenceBatch)
	for _, e := range effs {
		if e.Kind != poll.EffFence {
			rest = append(rest, e)
			continue
		}
		f := c.startFence(e.Key)
		if done, ok := c.callFence(e.Key); ok && done {
			fenced, keys = append(fenced, f), append(keys, e.Key)
		} else if !ok {
			c.fenceMu.Lock()
			if c.fences[e.Key] == f {
				f.retry = true
			}
			c.fenceMu.Unlock()
		}
		if len(keys) == fenceBatch {
			c.perform(c.finishFences(keys, fenced))
			fenced, keys = fenced[:0], keys[:0]
		}
	}
	c.perform(c.finishFences(keys, fenced))
	return rest
}

// fenceBatch is how many fenced rooms performFencesFirst makes visible
// per table lock: few locks, and rooms turning visible from the first
// milliseconds on rather than all at once at the end.
const fenceBatch = 1024

// startFence registers a fence in progress for k before the data plane is
// asked (it may report Fenced from another goroutine before Fence returns).
func (c *core) startFence(k poll.Key) *fenceState {
	c.fenceMu.Lock()
	defer c.fenceMu.Unlock()
	f := c.fences[k]
	if f == nil {
		f = &fenceState{}
		c.fences[k] = f
	}
	f.retry = false
	return f
}

// finishFences is finishFence for many rooms under one lock of each kind:
// a room whose fence was reported or dropped meanwhile is skipped.
func (c *core) finishFences(keys []poll.Key, started []*fenceState) []poll.Effect {
	if len(keys) == 0 {
		return nil
	}
	c.fenceMu.Lock()
	n := 0
	for i, k := range keys {
		if c.fences[k] == started[i] {
			delete(c.fences, k)
			keys[n], started[n] = k, started[i]
			n++
		}
	}
	keys, started = keys[:n], started[:n]
	c.fenceMu.Unlock()
	var effs []poll.Effect
	c.withTable(func() {
		now := c.now()
		for _, k := range keys {
			_ = c.t.Step(now, poll.Event{Kind: poll.EvFenced, Key: k})
		}
		effs = c.takeLocked()
	})
	for _, f := range started {
		for _, fn := range f.then {
			fn()
		}
	}
	return effs
}

// at returns a channel closed at t on the node's clock, and a stop.
func (c *core) at(t time.Time) (<-chan struct{}, func()) {
	ch := make(chan struct{})
	return ch, c.atDo(t, func() { close(ch) })
}

// atDo runs f at t on the node's clock (at once if t has passed: a
// FakeClock runs a zero timer only at its next Advance) and returns a
// stop. A clock that arms at an absolute time (FakeClock) is asked to:
// time it moves between our Now and AfterFunc would make the timer late.
func (c *core) atDo(t time.Time, f func()) (stop func()) {
	if ac, ok := c.clock.(interface {
		AfterFuncAt(time.Time, func()) conn.Timer
	}); ok {
		timer := ac.AfterFuncAt(t, f)
		return func() { timer.Stop() }
	}
	d := t.Sub(c.clock.Now())
	if d <= 0 {
		f()
		return func() {}
	}
	timer := c.clock.AfterFunc(d, f)
	return func() { timer.Stop() }
}

// drainWatch follows, through a subscription, which awaited rooms became
// visible and when the latest room turned terminal.
type drainWatch struct {
	c       *core
	sub     *Subscription
	dropped uint64
	pending map[poll.Key]struct{} // failed, not yet seen visible
	lastEnd time.Time             // node clock: latest visible terminal transition
}

func (w *drainWatch) saw(tr Transition) {
	if !tr.To.Terminal() {
		return
	}
	delete(w.pending, tr.Key)
	// The grace runs from when the room turned visible (published), not
	// from when this goroutine got to read it: a reader behind on a loaded
	// machine, or on a backlog of rooms, would push the grace to the cap.
	if tr.At.After(w.lastEnd) {
		w.lastEnd = tr.At
	}
}

// await adds the rooms failed at the deadline, and those failed earlier
// whose Failed is not visible yet, to the rooms the drain waits for.
func (w *drainWatch) await(failed []poll.Key) {
	for _, k := range failed {
		w.pending[k] = struct{}{}
	}
	// A room leaves hidden as its publication reaches the subscription,
	// both in one input of the owner, so none is missed between this and
	// the loop.
	w.c.exec(func() {
		w.c.withTable(func() {
			for k := range w.c.hidden {
				w.pending[k] = struct{}{}
			}
		})
	})
}

// recheck asks the table about the awaited rooms once the subscription
// dropped transitions: a room visible as terminal, or gone, is done.
func (w *drainWatch) recheck() {
	d := w.sub.Dropped()
	if d == w.dropped || len(w.pending) == 0 {
		return
	}
	w.dropped = d
	ids := make([]poll.RoomID, 0, len(w.pending))
	keys := make([]poll.Key, 0, len(w.pending))
	for k := range w.pending {
		ids, keys = append(ids, k.Room), append(keys, k)
	}
	st := w.c.PollStatus(ids, nil)
	for i, k := range keys {
		if st[i].State.Terminal() || st[i].State == poll.StateNone || st[i].Nonce != k.Nonce {
			delete(w.pending, k)
			w.lastEnd = w.c.clock.Now()
		}
	}
}

// settle waits until every awaited room is visible, the latest terminal
// room has been visible for grace, and the peers not declared lost
// acknowledged every room notice, or ctx ends. It reports whether the notices were all
// acknowledged.
func (w *drainWatch) settle(ctx context.Context, grace time.Duration) bool {
	c := w.c
	var graceEnd <-chan struct{}
	stopGrace := func() {}
	defer func() { stopGrace() }()
	armed := time.Time{}
	for {
		w.recheck()
		removed := c.lk.FrameAcked()
		// A peer declared lost acknowledges nothing: its notices are not
		// waited for (it fails its side of the rooms itself, R10).
		acked := c.lk.UnackedRoomFramesToLivePeers() == 0
		waiting := len(w.pending) > 0
		if !waiting && !w.lastEnd.IsZero() && armed != w.lastEnd {
			stopGrace()
			armed = w.lastEnd
			graceEnd, stopGrace = c.at(w.lastEnd.Add(grace))
		}
		graceOver := w.lastEnd.IsZero() || !c.clock.Now().Before(w.lastEnd.Add(grace))
		if !waiting && graceOver && acked {
			return true
		}
		if graceOver {
			graceEnd = nil // closed: waiting on it would spin
		}
		select {
		case tr := <-w.sub.C():
			w.saw(tr)
		case <-removed:
		case <-graceEnd:
		case <-ctx.Done():
			return c.lk.UnackedRoomFramesToLivePeers() == 0
		}
	}
}
