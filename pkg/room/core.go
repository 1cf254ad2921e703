package room

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

// sideHooks are the per-side actions the shared core performs for poll
// effects.
type sideHooks interface {
	// notify sends the STATUS or ABORT a NotifyPeer effect asks for.
	notify(e poll.Effect)
	// fence asks the data plane to fence the room; false: Fenced follows.
	fence(k poll.Key) (done bool)
	forget(k poll.Key)
}

// core is what both nodes share: the room table behind one mutex, the
// effect driver, subscribers and parked calls. The reliable outbox,
// counters and workers are its link's (lk).
type core struct {
	cfg   conn.Config
	log   *zap.Logger
	clock conn.Clock
	hooks sideHooks
	// lk is the room code's way into the link machinery (pkg/conn).
	lk conn.Link

	// mu guards t, hidden, prefixes and parked (withTable). While the owner runs
	// only its inputs take it, so it is never contended; once the owner
	// stopped, inputs run on their callers under it. Transitions are
	// published inside withTable (takeLocked), on the owner goroutine, so
	// every subscriber sees them in table order.
	mu     sync.Mutex
	t      *poll.Table
	hidden map[poll.Key]poll.State // Failed rooms not yet visible: their visible "from"
	// prefixes is decode's prefix of the prefill rooms that have one
	// (prefix.go); nil on decode.
	prefixes map[poll.RoomID]roomPrefix
	// parked are the Abort calls waiting for their room's Failed to become
	// visible (its fence done), or for the room to go.
	parked map[poll.Key][]*parkedCall
	// parkedCalls counts the parked calls waiting now (not yet woken).
	parkedCalls atomic.Int64

	subMu sync.Mutex // taken inside mu (publish), never the other way round
	subs  map[*Subscription]struct{}
	// ended, if set (the node config's Ended), hears every room's end as
	// the table makes it (end, read.go).
	ended func(RoomEnd)

	fenceMu sync.Mutex
	// fences are the rooms whose fence the data plane has not reported
	// done yet (fence.go).
	fences map[poll.Key]*fenceState
	// halted is closed when the node stops: parked calls return.
	halted   chan struct{}
	haltOnce sync.Once

	// own is the owner goroutine's input queue (owner.go).
	own *owner

	// performHook, if set (tests, from the node config's performHook),
	// runs before a batch's effects are performed.
	performHook func([]poll.Effect)
	// publishHook, if set (tests), runs as each transition is published.
	publishHook func(Transition)
	// syncTicks (tests: the script harness, set before Start) makes the
	// tick worker wait for the owner's part of each tick before the
	// link's, as one step: with two nodes on one FakeClock, a tick then
	// ends before the other node's starts, so the trace is one order.
	syncTicks bool

	// opens are the multi-rank rooms' Opens, by room (ranks_open.go): the
	// owner's, touched only in owner inputs; dropped with the room.
	opens map[poll.RoomID]*openRecord
}

func newCore(lk conn.Link, performHook func([]poll.Effect), publishHook func(Transition)) (*core, error) {
	cfg := lk.Config()
	t, err := poll.New(cfg.Table)
	if err != nil {
		return nil, err
	}
	c := &core{
		cfg:         cfg,
		log:         lk.Logger(),
		clock:       lk.Clock(),
		lk:          lk,
		t:           t,
		subs:        make(map[*Subscription]struct{}),
		hidden:      make(map[poll.Key]poll.State),
		parked:      make(map[poll.Key][]*parkedCall),
		fences:      make(map[poll.Key]*fenceState),
		halted:      make(chan struct{}),
		performHook: performHook,
		publishHook: publishHook,
		own:         newOwner(),
	}
	go c.runOwner()
	return c, nil
}

// startWorkers starts the supervisor and the tick loop.
func (c *core) startWorkers() {
	c.lk.StartWorkers()
	// The first ticker is made here, not in the worker, so no tick of a
	// FakeClock advanced right after Start is missed.
	first := c.clock.NewTicker(c.cfg.TickInterval)
	c.lk.Go("tick", func(ctx context.Context) error {
		t := first
		if t == nil {
			t = c.clock.NewTicker(c.cfg.TickInterval) // a restart
		}
		first = nil
		return c.tickLoop(ctx, t)
	})
}

// stopWorkers cancels every worker and waits for them; parked calls
// return.
func (c *core) stopWorkers() {
	c.haltOnce.Do(func() { close(c.halted) })
	c.lk.StopWorkers()
	c.stopOwner()
}

// close is both owners' Close: once, fail every live room with reason
// shutdown, tell the peers and say goodbye (one attempt each, unless
// Shutdown did), then release the side's own resources with stop.
func (c *core) close(stop func()) error {
	if !c.lk.MarkClosed() {
		return nil
	}
	if c.lk.Started() {
		_ = c.step(poll.Event{Kind: poll.EvShutdown})
		c.lk.SayGoodbye(doneContext())
	}
	stop()
	return nil
}

// kill stops the node without telling anyone, like kill -9 (tests).
func (c *core) kill(stop func()) {
	c.lk.MarkClosed()
	stop()
}

// now is the node's monotonic time in nanoseconds (the table's time).
func (c *core) now() int64 { return c.lk.Now() }

// wall converts node time to wall time.
func (c *core) wall(ns int64) time.Time { return c.lk.Wall(ns) }

// takeLocked copies and acknowledges the table's pending effects and
// publishes the visible transitions among them before the lock is
// released: whichever goroutine performs the rest, subscribers see each
// room's transitions in the order the table made them.
func (c *core) takeLocked() []poll.Effect {
	r := c.t.Ready()
	if len(r) == 0 {
		return nil
	}
	effs := append([]poll.Effect(nil), r...)
	c.t.Advance()
	c.publishLocked(effs)
	return effs
}

// publishLocked publishes a batch's Transition and Publish effects and
// wakes the calls parked on rooms whose Failed became visible or that
// went. Publication never blocks (Subscription drops what does not fit).
// A room's move to a terminal state also goes to the Ended hook, which
// drops nothing: every room ends exactly once (I1).
func (c *core) publishLocked(effs []poll.Effect) {
	for _, e := range effs {
		switch e.Kind {
		case poll.EffTransition:
			// Checked first: the fields would be allocated for every room
			// of a 100k-room shutdown batch with debug off.
			if ce := c.log.Check(zap.DebugLevel, "room transition"); ce != nil {
				ce.Write(conn.RoomField(e.Key),
					zap.Stringer("from", e.From), zap.Stringer("to", e.To), zap.String("reason", string(e.Reason)))
			}
			if e.To.Terminal() {
				c.end(e)
			}
			if e.Visible {
				c.publish(Transition{Key: e.Key, From: e.From, To: e.To, Reason: e.Reason, PeerReason: e.PeerReason,
					PrefixLen: c.prefixOfLocked(e.Key), At: c.wall(e.At)})
			} else {
				c.hidden[e.Key] = e.From
			}
		case poll.EffPublish:
			from := c.hidden[e.Key]
			delete(c.hidden, e.Key)
			c.publish(Transition{Key: e.Key, From: from, To: poll.Failed, Reason: e.Reason, PeerReason: e.PeerReason,
				PrefixLen: c.prefixOfLocked(e.Key), At: c.wall(e.At)})
			c.unparkLocked(e.Key)
		case poll.EffReaped, poll.EffRemoved:
			delete(c.hidden, e.Key)
			c.dropPrefix(e.Key) // in the critical section that removed the room (I6)
			c.unparkLocked(e.Key)
		}
	}
}

// step applies one event and performs its effects, as one input of the
// owner.
func (c *core) step(ev poll.Event) error {
	var err error
	c.apply(func() { err = c.t.Step(c.now(), ev) })
	return err
}

// apply runs change on the table and performs the effects it made, as one
// input of the owner.
func (c *core) apply(change func()) { c.exec(func() { c.applyOwned(change) }) }

// applyOwned is apply inside an input: change and the publication under
// withTable, then the effects in table order.
func (c *core) applyOwned(change func()) {
	var effs []poll.Effect
	c.withTable(func() {
		change()
		effs = c.takeLocked()
	})
	c.perform(effs)
}

// perform carries out effects in order (poll doc, Usage 4); transitions
// were published already (takeLocked). A Fence is a request to the data
// plane that never waits: when it is done at once, EvFenced is stepped
// and its effects join the batch; otherwise the data plane's Fenced call
// steps it later (fence.go).
func (c *core) perform(effs []poll.Effect) {
	if c.performHook != nil && len(effs) > 0 {
		c.performHook(effs)
	}
	for i := 0; i < len(effs); i++ {
		e := effs[i]
		switch e.Kind {
		case poll.EffNotifyPeer:
			c.hooks.notify(e)
		case poll.EffReplyUnknown:
			// Answered by the ACK of the frame that caused it.
		case poll.EffFence:
			effs = append(effs, c.fenceRoom(e.Key)...)
		case poll.EffRebound:
			// The room's METADATA, unanswered or refused by the instance
			// that restarted, goes to the new one once it registered us.
			c.log.Debug("room moved to the restarted peer's new instance", conn.RoomField(e.Key), zap.Uint32("peer", uint32(e.Peer)))
			c.lk.Rebound(e.Key)
		case poll.EffReaped, poll.EffRemoved:
			if e.Kind == poll.EffReaped {
				c.log.Info("uncleared room reaped", conn.RoomField(e.Key), zap.Stringer("state", e.Status))
			}
			c.dropFence(e.Key)
			c.dropOpen(e.Key)
			c.hooks.forget(e.Key)
		}
	}
}

// tickLoop is the supervised worker that drives time: table deadlines,
// retransmits, heartbeats and peer liveness.
func (c *core) tickLoop(ctx context.Context, t conn.Ticker) error {
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			c.onTick()
			t.Done()
		}
	}
}

// onTick queues the owner's part of the tick (deadlines, fence retries:
// one input, coalesced while one waits) and lets the link retransmit, send
// heartbeats and find lost peers on the tick worker without waiting for
// it: a busy owner delays its deadlines, never this node's heartbeats.
// What the link delivers from here goes to the owner as inputs of their
// own, after the tick's.
func (c *core) onTick() {
	ownerPart := func() {
		c.applyOwned(func() { c.t.Tick(c.now()) })
		c.retryFences()
	}
	if c.syncTicks {
		c.exec(ownerPart)
	} else {
		c.postTick(ownerPart)
	}
	c.lk.Tick(c.now())
}

// fromTickWorker queues an input the link raised on the tick worker
// (PeerLost) without waiting for it (but see syncTicks).
func (c *core) fromTickWorker(fn func()) {
	if c.syncTicks {
		c.exec(fn)
		return
	}
	c.post(fn)
}

// answer turns the outcome of stepping a peer's frame into its ACK. echo
// reports whether NotifyPeer effects to that peer about that room are
// answered by the ACK (and must not be sent again).
func answer(err error, effs []poll.Effect, ev poll.Event) (a conn.AckResult, echo bool) {
	findEcho := func() (poll.Effect, bool) {
		for _, e := range effs {
			if (e.Kind == poll.EffNotifyPeer || e.Kind == poll.EffReplyUnknown) && e.Peer == ev.Peer && e.Key.Room == ev.Key.Room {
				return e, true
			}
		}
		return poll.Effect{}, false
	}
	ended := func(e poll.Effect) conn.AckResult {
		a := conn.AckResult{Result: pdlinkv1.AckResult_ACK_RESULT_ENDED}
		if e.Status != poll.Success {
			a.Reason = string(e.Reason)
			if a.Reason == "" {
				a.Reason = string(poll.ReasonAbortedRemote)
			}
		}
		return a
	}
	switch {
	case err == nil:
		return conn.AckApplied, false
	case errors.Is(err, poll.ErrRoomEnded), errors.Is(err, poll.ErrTerminal), errors.Is(err, poll.ErrNonceMismatch):
		if e, ok := findEcho(); ok && (e.Kind == poll.EffNotifyPeer || e.Reply == poll.ReplyEnded) {
			return ended(e), true
		}
		if errors.Is(err, poll.ErrNonceMismatch) {
			return conn.AckRejected(conn.RejectForeignRoom), false
		}
		return conn.AckApplied, false // a failure for a room that already ended: moot
	case errors.Is(err, poll.ErrNotFound):
		return conn.AckNotOpen, true
	case errors.Is(err, poll.ErrPeerMismatch):
		return conn.AckRejected(conn.RejectForeignRoom), false
	case errors.Is(err, poll.ErrIllegalTransition):
		return conn.AckApplied, false // already past this step: idempotent
	}
	return conn.AckRejected(conn.RejectInvalid), false
}

// stepFrameOwned steps a peer's frame event inside the frame's owner
// input (deliver), performs its effects and returns the frame's answer,
// which the input sends last (the ACK is the step's last effect).
func (c *core) stepFrameOwned(ev poll.Event) (conn.AckResult, error) {
	var err error
	var effs []poll.Effect
	c.withTable(func() {
		err = c.t.Step(c.now(), ev)
		effs = c.takeLocked()
	})
	a, echo := answer(err, effs, ev)
	if echo {
		kept := effs[:0]
		for _, e := range effs {
			if (e.Kind == poll.EffNotifyPeer || e.Kind == poll.EffReplyUnknown) && e.Peer == ev.Peer && e.Key.Room == ev.Key.Room {
				continue
			}
			kept = append(kept, e)
		}
		effs = kept
	}
	c.perform(effs)
	return a, err
}

// roomStateNow returns the room's state read under the table's lock, not
// through the owner's queue: the link's goroutines (the tick worker's
// retransmits, a reader's ACK) ask it and wait at most for the step the
// owner is in, never for the inputs queued before.
func (c *core) roomStateNow(id poll.RoomID) (poll.State, bool) {
	var info poll.RoomInfo
	var err error
	c.withTable(func() { info, err = c.t.Get(id) })
	if err != nil {
		return poll.StateNone, false
	}
	return info.State, true
}

// liveRoomsNow is the live-room count heartbeats carry, read under the
// table's lock (see roomStateNow) so the tick worker's heartbeats never
// wait for the owner's queue.
func (c *core) liveRoomsNow() uint32 {
	var st poll.Stats
	c.withTable(func() { st = c.t.Stats(c.now()) })
	return uint32(st.Inflight)
}

// doneContext is an already cancelled context: Close says goodbye once
// without waiting.
func doneContext() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}
