package conn

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
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
	// maintain sends heartbeats and declares peers lost (tick loop).
	maintain(now int64)
	// unknownToPeer: the peer behind dest answered unknown_peer (it forgot
	// us): register again (decode); nothing to do on prefill.
	unknownToPeer(dest target)
	// goodbyeTargets are the peers to tell that this node is leaving.
	goodbyeTargets() []target
	// farewell: the peer behind dest acknowledged our GOODBYE; no more
	// heartbeats to it, and it is not declared lost.
	farewell(dest target)
}

// core is what both nodes share: the room table behind one mutex, the
// effect driver, the reliable outbox, subscribers and counters.
type core struct {
	cfg   Config
	log   *zap.Logger
	clock Clock
	start time.Time
	codec *Codec
	ctr   counters
	out   *outbox
	hooks sideHooks
	// lk is the room code's way into the link machinery (link.go).
	lk linkBase

	// mu guards t, hidden and parked. Transitions are published while it
	// is held (takeLocked), so every subscriber sees them in table order.
	mu     sync.Mutex
	t      *poll.Table
	hidden map[poll.Key]poll.State // Failed rooms not yet visible: their visible "from"
	// parked are the Abort calls waiting for their room's Failed to become
	// visible (its fence done), or for the room to go.
	parked map[poll.Key][]*parkedCall
	// parkedCalls counts the parked calls waiting now (not yet woken).
	parkedCalls atomic.Int64

	subMu sync.Mutex // taken inside mu (publish), never the other way round
	subs  map[*Subscription]struct{}

	fenceMu sync.Mutex
	// fences are the rooms whose fence the data plane has not reported
	// done yet (fence.go).
	fences map[poll.Key]*fenceState
	// halted is closed when the node stops: parked calls return.
	halted   chan struct{}
	haltOnce sync.Once

	sup     *supervisor
	ctx     context.Context // the workers' context, set by Start
	cancel  context.CancelFunc
	started atomic.Bool
	closed  atomic.Bool
	// saidGoodbye: GOODBYE went to the peers (goodbye.go); the node is
	// leaving and keeps quiet.
	saidGoodbye atomic.Bool

	limiter logLimiter

	// frameHook, if set (tests, from Config.frameHook), runs before each
	// received frame is handled.
	frameHook func(FrameType)
	// performHook, if set (tests, from Config.performHook), runs before a
	// batch's effects are performed, outside the table lock.
	performHook func([]poll.Effect)
}

func newCore(cfg Config, side poll.Side) (*core, error) {
	cfg, err := cfg.withDefaults(side)
	if err != nil {
		return nil, err
	}
	t, err := poll.New(cfg.Table)
	if err != nil {
		return nil, err
	}
	c := &core{
		cfg:         cfg,
		log:         cfg.Logger.With(zap.String("side", side.String()), zap.String("instance", cfg.Instance)),
		clock:       cfg.Clock,
		start:       cfg.Clock.Now(),
		codec:       &Codec{Limits: cfg.Limits, Auth: cfg.Auth},
		out:         newOutbox(cfg.RetryBase, cfg.RetryMax, cfg.Seed),
		t:           t,
		subs:        make(map[*Subscription]struct{}),
		hidden:      make(map[poll.Key]poll.State),
		parked:      make(map[poll.Key][]*parkedCall),
		fences:      make(map[poll.Key]*fenceState),
		halted:      make(chan struct{}),
		frameHook:   cfg.frameHook,
		performHook: cfg.performHook,
	}
	c.limiter.clock = c.clock
	c.lk = linkBase{c}
	return c, nil
}

// startWorkers starts the supervisor and the tick loop.
func (c *core) startWorkers() {
	ctx, cancel := context.WithCancel(context.Background())
	c.ctx, c.cancel = ctx, cancel
	c.sup = &supervisor{ctx: ctx, clock: c.clock, log: c.log, restarts: &c.ctr.restarts}
	// The first ticker is made here, not in the worker, so no tick of a
	// FakeClock advanced right after Start is missed.
	first := c.clock.NewTicker(c.cfg.TickInterval)
	c.sup.Go("tick", func(ctx context.Context) error {
		t := first
		if t == nil {
			t = c.clock.NewTicker(c.cfg.TickInterval) // a restart
		}
		first = nil
		return c.tickLoop(ctx, t)
	})
	c.started.Store(true)
}

// stopWorkers cancels every worker and waits for them; parked calls
// return.
func (c *core) stopWorkers() {
	c.haltOnce.Do(func() { close(c.halted) })
	if c.cancel != nil {
		c.cancel()
		c.sup.Wait()
	}
}

// now is the node's monotonic time in nanoseconds (the table's time).
func (c *core) now() int64 { return int64(c.clock.Now().Sub(c.start)) }

// wall converts node time to wall time.
func (c *core) wall(ns int64) time.Time { return c.start.Add(time.Duration(ns)) }

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
func (c *core) publishLocked(effs []poll.Effect) {
	for _, e := range effs {
		switch e.Kind {
		case poll.EffTransition:
			// Checked first: the fields would be allocated for every room
			// of a 100k-room shutdown batch with debug off.
			if ce := c.log.Check(zap.DebugLevel, "room transition"); ce != nil {
				ce.Write(zap.Uint64("room", uint64(e.Key.Room)), zap.Uint64("nonce", uint64(e.Key.Nonce)),
					zap.Stringer("from", e.From), zap.Stringer("to", e.To), zap.String("reason", string(e.Reason)))
			}
			if e.Visible {
				c.publish(Transition{Key: e.Key, From: e.From, To: e.To, Reason: e.Reason, PeerReason: e.PeerReason, At: c.wall(e.At)})
			} else {
				c.hidden[e.Key] = e.From
			}
		case poll.EffPublish:
			from := c.hidden[e.Key]
			delete(c.hidden, e.Key)
			c.publish(Transition{Key: e.Key, From: from, To: poll.Failed, Reason: e.Reason, PeerReason: e.PeerReason, At: c.wall(e.At)})
			c.unparkLocked(e.Key)
		case poll.EffReaped, poll.EffRemoved:
			delete(c.hidden, e.Key)
			c.unparkLocked(e.Key)
		}
	}
}

// step applies one event and performs its effects outside the lock.
func (c *core) step(ev poll.Event) error {
	c.mu.Lock()
	err := c.t.Step(c.now(), ev)
	effs := c.takeLocked()
	c.mu.Unlock()
	c.perform(effs)
	return err
}

// tick expires deadlines and performs the effects.
func (c *core) tick() {
	c.mu.Lock()
	c.t.Tick(c.now())
	effs := c.takeLocked()
	c.mu.Unlock()
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
			c.log.Debug("room moved to the restarted peer's new instance", zap.Uint64("room", uint64(e.Key.Room)), zap.Uint32("peer", uint32(e.Peer)))
			c.lk.rebound(e.Key)
		case poll.EffReaped, poll.EffRemoved:
			if e.Kind == poll.EffReaped {
				c.log.Info("uncleared room reaped", zap.Uint64("room", uint64(e.Key.Room)), zap.Stringer("state", e.Status))
			}
			c.dropFence(e.Key)
			c.hooks.forget(e.Key)
		}
	}
}

// tickLoop is the supervised worker that drives time: table deadlines,
// retransmits, heartbeats and peer liveness.
func (c *core) tickLoop(ctx context.Context, t Ticker) error {
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

func (c *core) onTick() {
	c.tick()
	c.retryFences()
	now := c.now()
	c.retransmit(now)
	c.hooks.maintain(now)
}

// answer turns the outcome of stepping a peer's frame into its ACK. echo
// reports whether NotifyPeer effects to that peer about that room are
// answered by the ACK (and must not be sent again).
func answer(err error, effs []poll.Effect, ev poll.Event) (a ackResult, echo bool) {
	findEcho := func() (poll.Effect, bool) {
		for _, e := range effs {
			if (e.Kind == poll.EffNotifyPeer || e.Kind == poll.EffReplyUnknown) && e.Peer == ev.Peer && e.Key.Room == ev.Key.Room {
				return e, true
			}
		}
		return poll.Effect{}, false
	}
	ended := func(e poll.Effect) ackResult {
		a := ackResult{result: pdlinkv1.AckResult_ACK_RESULT_ENDED}
		if e.Status != poll.Success {
			a.reason = string(e.Reason)
			if a.reason == "" {
				a.reason = string(poll.ReasonAbortedRemote)
			}
		}
		return a
	}
	switch {
	case err == nil:
		return ackApplied, false
	case errors.Is(err, poll.ErrRoomEnded), errors.Is(err, poll.ErrTerminal), errors.Is(err, poll.ErrNonceMismatch):
		if e, ok := findEcho(); ok && (e.Kind == poll.EffNotifyPeer || e.Reply == poll.ReplyEnded) {
			return ended(e), true
		}
		if errors.Is(err, poll.ErrNonceMismatch) {
			return ackRejected(RejectForeignRoom), false
		}
		return ackApplied, false // a failure for a room that already ended: moot
	case errors.Is(err, poll.ErrNotFound):
		return ackNotOpen, true
	case errors.Is(err, poll.ErrPeerMismatch):
		return ackRejected(RejectForeignRoom), false
	case errors.Is(err, poll.ErrIllegalTransition):
		return ackApplied, false // already past this step: idempotent
	}
	return ackRejected(RejectInvalid), false
}

// stepFrame steps a peer's frame event and returns the ACK answer.
func (c *core) stepFrame(ev poll.Event) (ackResult, error) {
	c.mu.Lock()
	err := c.t.Step(c.now(), ev)
	effs := c.takeLocked()
	c.mu.Unlock()
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

// roomDeadline returns the room's current deadline (node time), or false.
func (c *core) roomDeadline(id poll.RoomID) (int64, poll.State, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	info, err := c.t.Get(id)
	if err != nil {
		return 0, poll.StateNone, false
	}
	return info.Deadline, info.State, true
}
