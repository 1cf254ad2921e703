package conn

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/loglimit"
	"github.com/pdlink/pdlink/pkg/poll"
)

// The link/room seam. A link (PrefillLink in link_prefill.go, DecodeLink
// in link_decode.go) owns the transport side: sockets and sessions, the
// codec, validation, reliable delivery (reliable.go: seq, ACK, retransmit,
// dedupe), peers, REGISTER, heartbeats and liveness, GOODBYE and
// departures. The room side (package room) owns the poll.Table and
// everything that steps it. The link reaches the room side only through
// RoomSide; the room side reaches peers only through its link's methods
// (Target, SendFollowing, Session, Peers, Counters) and the opaque Target
// handles the link hands it.

// linkHooks are what the shared link machinery asks of its side's link.
type linkHooks interface {
	// maintain sends heartbeats and declares peers lost (tick worker).
	maintain(now int64)
	// unknownToPeer: the peer behind dest answered unknown_peer (it forgot
	// us): register again (decode); nothing to do on prefill.
	unknownToPeer(dest Target)
	// goodbyeTargets are the peers to tell that this node is leaving.
	goodbyeTargets() []Target
	// farewell: the peer behind dest acknowledged our GOODBYE; no more
	// heartbeats to it, and it is not declared lost.
	farewell(dest Target)
	// peerLost reports whether id was declared lost (or forgotten): it
	// acknowledges nothing until it is heard again.
	peerLost(id poll.PeerID) bool
}

// core is the link machinery both links share: config, clock, codec,
// reliable outbox, counters, the supervisor of the node's workers.
type core struct {
	cfg   Config
	log   *zap.Logger
	clock Clock
	start time.Time
	codec *Codec
	ctr   counters
	out   *outbox
	hooks linkHooks

	sup     *supervisor
	ctx     context.Context // the workers' context, set by StartWorkers
	cancel  context.CancelFunc
	started atomic.Bool
	closed  atomic.Bool
	// saidGoodbye: GOODBYE went to the peers (goodbye.go); the node is
	// leaving and keeps quiet.
	saidGoodbye atomic.Bool

	limiter *loglimit.Limiter[RejectReason]

	// unansweredFrames and unansweredBytes are the room frames out with
	// the room side (AckToken), against MaxUnansweredFrames and Bytes.
	unansweredFrames atomic.Int64
	unansweredBytes  atomic.Int64

	// frameHook, if set (tests, from Config.FrameHook), runs before each
	// received frame is handled.
	frameHook func(FrameType)
}

func newCore(cfg Config, side poll.Side) (*core, error) {
	cfg, err := cfg.withDefaults(side)
	if err != nil {
		return nil, err
	}
	c := &core{
		cfg:       cfg,
		log:       cfg.Logger.With(zap.String("side", side.String()), zap.String("instance", cfg.Instance)),
		clock:     cfg.Clock,
		start:     cfg.Clock.Now(),
		codec:     &Codec{Limits: cfg.Limits, Auth: cfg.Auth},
		out:       newOutbox(cfg.RetryBase, cfg.RetryMax, cfg.Seed),
		frameHook: cfg.FrameHook,
	}
	c.limiter = loglimit.New(numRejectReasons, time.Second, c.clock.Now)
	return c, nil
}

// now is the node's monotonic time in nanoseconds (the table's time).
func (c *core) now() int64 { return int64(c.clock.Now().Sub(c.start)) }

// wall converts node time to wall time.
func (c *core) wall(ns int64) time.Time { return c.start.Add(time.Duration(ns)) }

// Link is the link machinery both links share and the calls the room side
// makes into it: the node's config, clock and workers, reliable sends,
// the REGISTER wait of rebound rooms, the unacknowledged room notices a
// drain waits for, GOODBYE. PrefillLink and DecodeLink embed it.
type Link struct{ *core }

// Config is the node's config with every default filled in.
func (l Link) Config() Config { return l.cfg }

// Logger is the node's logger (side and instance fields set).
func (l Link) Logger() *zap.Logger { return l.log }

// Clock is the node's clock.
func (l Link) Clock() Clock { return l.clock }

// Now is the node's monotonic time in nanoseconds (the table's time).
func (l Link) Now() int64 { return l.now() }

// Wall converts node time to wall time.
func (l Link) Wall(ns int64) time.Time { return l.wall(ns) }

// StartWorkers starts the supervisor of the node's workers; Go runs one
// under it.
func (l Link) StartWorkers() {
	ctx, cancel := context.WithCancel(context.Background())
	l.ctx, l.cancel = ctx, cancel
	l.sup = &supervisor{ctx: ctx, clock: l.clock, log: l.log, restarts: &l.ctr.restarts}
	l.started.Store(true)
}

// Go runs fn as a supervised worker (R6): a panic or an error is logged,
// counted in WorkerRestarts and fn runs again after a backoff.
func (l Link) Go(name string, fn func(ctx context.Context) error) { l.sup.Go(name, fn) }

// StopWorkers cancels every worker and waits for them.
func (l Link) StopWorkers() {
	if l.cancel != nil {
		l.cancel()
		l.sup.Wait()
	}
}

// Started reports whether StartWorkers ran.
func (l Link) Started() bool { return l.started.Load() }

// MarkClosed marks the node closed (no new sessions) and reports whether
// this call did it.
func (l Link) MarkClosed() bool { return l.closed.CompareAndSwap(false, true) }

// Closed reports whether the node is closed.
func (l Link) Closed() bool { return l.closed.Load() }

// Tick resends due reliable frames, abandons expired ones, sends
// heartbeats and declares silent peers lost (the tick worker).
func (l Link) Tick(now int64) {
	l.retransmit(now)
	l.hooks.maintain(now)
}

// CountWorkerRestart counts a room-side worker call recovered from a panic
// (a data-plane fence) in WorkerRestarts.
func (l Link) CountWorkerRestart() { l.ctr.restarts.Add(1) }

// CountWatchDropped counts a transition a slow subscriber missed.
func (l Link) CountWatchDropped() { l.ctr.dropped.Add(1) }

// Send sends env reliably to dest until it is acknowledged or giveUp.
func (l Link) Send(dest Target, env *pdlinkv1.Envelope, key poll.Key, giveUp int64) {
	l.sendReliable(dest, env, key, giveUp, nil, nil)
}

// Rebound marks the frames about key to go again as soon as their peer
// acknowledges our REGISTER (poll moved the room to a restarted peer's
// new instance).
func (l Link) Rebound(key poll.Key) { l.out.awaitRegister(key) }

// UnackedRoomFrames counts the frames about rooms not acknowledged yet.
func (l Link) UnackedRoomFrames() int { return l.out.roomFrames() }

// UnackedRoomFramesToLivePeers counts the frames about rooms not
// acknowledged yet, leaving out those to peers declared lost: what a
// drain can still hope to see acknowledged.
func (l Link) UnackedRoomFramesToLivePeers() int { return l.out.roomFramesExcept(l.hooks.peerLost) }

// UnackedFrames counts the reliable frames not acknowledged yet.
func (l Link) UnackedFrames() int { return l.out.len() }

// SetJitterSource replaces the source of the retransmit jitter (tests: a
// constant source makes the backoff of frames due in one tick independent
// of the order the outbox visits them in).
func (l Link) SetJitterSource(src rand.Source) {
	l.out.mu.Lock()
	defer l.out.mu.Unlock()
	l.out.rng = rand.New(src)
}

// FrameAcked is closed the next time a frame leaves the outbox or a peer is
// declared lost.
func (l Link) FrameAcked() <-chan struct{} {
	l.out.mu.Lock()
	defer l.out.mu.Unlock()
	return l.out.removed
}

// AwaitRoomFramesAcked waits until every frame about a room is
// acknowledged (or given up), or ctx ends.
func (l Link) AwaitRoomFramesAcked(ctx context.Context) {
	l.out.waitUntil(ctx, func() bool { return l.out.roomFrames() == 0 })
}

// Departed forgets what is queued for a peer that said goodbye, counts
// the goodbye and returns the number of frames dropped.
func (l Link) Departed(id poll.PeerID) int {
	l.ctr.peerGoodbyes.Add(1)
	return l.out.cancelPeer(id)
}

// SayGoodbye tells the peers this node is leaving (goodbye.go).
func (l Link) SayGoodbye(ctx context.Context) { l.sayGoodbye(ctx) }

// RoomSide is what a link delivers to its room side and asks of it. A
// peer's room frames are delivered one at a time in the order its
// connection delivered them, duplicates never, and FrameIn never waits for
// the room owner: the reader goes back to its socket at once, so
// heartbeats and ACKs keep flowing however busy the owner is. PeerLost
// comes from the tick worker and must not wait either; PeerRestarted and
// PeerGone (once per peer incarnation) may.
type RoomSide interface {
	// FrameIn hands over a valid, non-duplicate room frame (METADATA,
	// ABORT, STATUS, ABORT_ACK, or one this side never receives) from the
	// peer behind from, to be stepped later; from is the handle to send
	// replies about the frame to. The room side answers it with Ack(tok)
	// once the frame's effects are performed, or Cancel(tok) if it never
	// steps it; false: it takes no frames any more (the link cancels tok).
	FrameIn(from Target, ft FrameType, env *pdlinkv1.Envelope, tok *AckToken) bool
	// PeerLost: the peer id was silent for HeartbeatMisses intervals.
	PeerLost(id poll.PeerID)
	// PeerRestarted: a new incarnation replaced old. On decode the
	// session goes on as id (REGISTER to it already on its way); on
	// prefill id is NoPeer (the new one registered as a new peer). The
	// old incarnation's queued frames are dropped (before this call on
	// prefill, right after it on decode).
	PeerRestarted(old, id poll.PeerID)
	// PeerGone: the peer id said goodbye; the link forgot it.
	PeerGone(id poll.PeerID, fields ...zap.Field)
	// LiveRooms is the live-room count heartbeats carry (tick worker: it
	// must not wait for the owner's queue).
	LiveRooms() uint32
}

// AckToken is a room frame the link handed to its room side, until the
// room side answers it (Link.Ack: the frame's ACK, an effect of stepping
// it) or gives it back unanswered (Link.Cancel). While it is out, a
// retransmit of the frame is dropped (counted as a duplicate): the answer
// to the first copy answers it, or the retransmit after that finds the
// answer in the dedupe window.
type AckToken struct {
	dest Target
	from string // the peer, for logs and counters
	seq  uint64
	size int // encoded bytes, in the MaxUnansweredBytes budget
	// dd is the dedupe window of the peer incarnation that sent the
	// frame, guarded by mu (the link's peer or session mutex).
	dd       *dedupe
	mu       *sync.Mutex
	answered atomic.Bool
}

// Ack answers the room frame of tok with a: the answer is remembered for
// retransmits (if final) and the ACK sent. A second answer is ignored.
func (l Link) Ack(tok *AckToken, a AckResult) {
	if !l.settle(tok, &a) {
		return
	}
	l.finishFrame(tok.dest, tok.from, tok.seq, a, nil)
}

// Cancel gives back the room frame of tok unanswered (the owner stopped
// or the step panicked): no ACK leaves, and the peer's retransmit is
// delivered again, to this node if it runs or to its next incarnation.
func (l Link) Cancel(tok *AckToken) { l.settle(tok, nil) }

// Unanswered counts the room frames handed to the room side and not
// answered yet.
func (l Link) Unanswered() int { return int(l.unansweredFrames.Load()) }

// deliverRoomFrame hands a room frame to the room side without waiting
// for it. A frame that finds MaxUnansweredFrames (or Bytes) already out
// is dropped unanswered and counted (RejectOwnerBusy): the peer
// retransmits it. The caller checked under mu that seq is neither
// answered nor out (a peer's frames are read by one goroutine, so no
// other copy of seq can be marked in between). Decode's session readers
// check the budget concurrently, so it may be passed by one frame per
// prefill session at most.
func (c *core) deliverRoomFrame(room RoomSide, dest Target, from string, ft FrameType, env *pdlinkv1.Envelope, size int, dd *dedupe, mu *sync.Mutex) {
	if c.unansweredFrames.Load() >= int64(c.cfg.MaxUnansweredFrames) || c.unansweredBytes.Load()+int64(size) > int64(c.cfg.MaxUnansweredBytes) {
		c.reject(RejectOwnerBusy, from, nil)
		return
	}
	c.unansweredFrames.Add(1)
	c.unansweredBytes.Add(int64(size))
	tok := &AckToken{dest: dest, from: from, seq: env.GetSeq(), size: size, dd: dd, mu: mu}
	if tok.seq != 0 {
		mu.Lock()
		dd.withOwner[tok.seq] = struct{}{}
		mu.Unlock()
	}
	if !room.FrameIn(dest, ft, env, tok) {
		c.settle(tok, nil)
	}
}

// settle ends tok once: the frame leaves the owner's budget and its
// withOwner mark, and a final answer enters the dedupe window in the same
// critical section (so a retransmit sees one or the other). It reports
// whether this call ended tok.
func (c *core) settle(tok *AckToken, a *AckResult) bool {
	if !tok.answered.CompareAndSwap(false, true) {
		return false
	}
	c.unansweredFrames.Add(-1)
	c.unansweredBytes.Add(-int64(tok.size))
	if tok.seq != 0 {
		tok.mu.Lock()
		delete(tok.dd.withOwner, tok.seq)
		if a != nil && a.final() {
			tok.dd.put(tok.seq, *a)
		}
		tok.mu.Unlock()
	}
	return true
}

// finishFrame counts a rejection, remembers a final answer (remember, if
// set) and sends it.
func (c *core) finishFrame(dest Target, from string, seq uint64, a AckResult, remember func(uint64, AckResult)) {
	if a.Result == pdlinkv1.AckResult_ACK_RESULT_REJECTED {
		r := RejectInvalid
		for _, x := range AllRejectReasons() {
			if x.String() == a.Reason {
				r = x
			}
		}
		c.reject(r, from, nil)
	}
	if seq == 0 {
		return
	}
	if a.final() && remember != nil {
		remember(seq, a)
	}
	c.sendAck(dest, seq, a)
}

// sendHeartbeat sends one HEARTBEAT (best effort) carrying live rooms.
func (c *core) sendHeartbeat(dest Target, live uint32) {
	env := c.envelope(0)
	env.Body = &pdlinkv1.Envelope_Heartbeat{Heartbeat: &pdlinkv1.Heartbeat{LiveRooms: live}}
	_, _ = c.transmit(dest, env)
}

// Reliable delivery on top of the outbox (reliable.go), and the frame
// intake every reader runs first.

// envelope returns an envelope header for this node.
func (c *core) envelope(seq uint64) *pdlinkv1.Envelope {
	return &pdlinkv1.Envelope{ProtocolVersion: ProtocolVersion, SenderInstance: c.cfg.Instance, Epoch: c.cfg.Epoch, Seq: seq}
}

// transmit encodes env and sends one copy.
func (c *core) transmit(dest Target, env *pdlinkv1.Envelope) ([]byte, error) {
	frame, err := c.codec.Encode(env)
	if err != nil {
		c.ctr.sendErrors.Add(1)
		c.log.Error("cannot encode frame", zap.Error(err))
		return nil, err
	}
	c.send(dest, env, frame)
	return frame, nil
}

func (c *core) send(dest Target, env *pdlinkv1.Envelope, frame []byte) {
	if ft, ok := FrameTypeOf(env); ok {
		c.ctr.frames[Sent][ft].Add(1)
	}
	if err := dest.transmit(frame); err != nil {
		c.ctr.sendErrors.Add(1)
		c.log.Debug("frame send failed", zap.Error(err))
	}
}

// sendReliable sends env (body set) with a fresh seq and keeps it for
// retransmission until acknowledged or giveUp (node time).
func (c *core) sendReliable(dest Target, env *pdlinkv1.Envelope, key poll.Key, giveUp int64, want func() bool, onAck func(poll.PeerID, AckResult) bool) {
	ft, _ := FrameTypeOf(env)
	p := &pending{ft: ft, dest: dest, key: key, giveUp: giveUp, want: want, onAck: onAck}
	now := c.now()
	hdr := c.envelope(0)
	env.ProtocolVersion, env.SenderInstance, env.Epoch = hdr.ProtocolVersion, hdr.SenderInstance, hdr.Epoch
	// The seq is drawn by the outbox so retransmits and ACKs agree on it;
	// p is complete before the outbox (and its retransmit worker) sees it.
	env.Seq = c.out.nextSeq()
	frame, err := c.codec.Encode(env)
	if err != nil {
		c.ctr.sendErrors.Add(1)
		c.log.Error("cannot encode frame", zap.Error(err))
		return
	}
	p.seq, p.frame = env.Seq, frame
	c.out.add(now, p)
	c.send(dest, env, frame)
}

// retransmit resends due frames and abandons expired ones.
func (c *core) retransmit(now int64) {
	resend, expired := c.out.due(now)
	for _, p := range expired {
		c.ctr.giveUps.Add(1)
		c.log.Debug("reliable frame abandoned at its deadline", zap.Stringer("type", p.ft), zap.Uint64("seq", p.seq), RoomField(p.key))
	}
	for _, p := range resend {
		if p.frame != nil {
			c.resend(p)
		}
	}
}

// resend sends p again unless its room no longer wants it.
func (c *core) resend(p *pending) {
	if p.want != nil && !p.want() {
		c.out.drop(p.seq)
		return
	}
	c.ctr.retransmits.Add(1)
	c.ctr.frames[Sent][p.ft].Add(1)
	if err := p.dest.transmit(p.frame); err != nil {
		c.ctr.sendErrors.Add(1)
	}
}

// resendRegistered sends at once the frames that waited for the peer to
// acknowledge our REGISTER (about rooms poll moved to it, Rebound) instead
// of leaving them to their backoff.
func (c *core) resendRegistered(id poll.PeerID) {
	for _, p := range c.out.registered(id) {
		c.resend(p)
	}
}

// sendAck answers a reliable frame.
func (c *core) sendAck(dest Target, seq uint64, a AckResult) {
	env := c.envelope(0)
	env.Body = &pdlinkv1.Envelope_Ack{Ack: &pdlinkv1.Ack{AckedSeq: seq, Result: a.Result, Reason: a.Reason}}
	_, _ = c.transmit(dest, env)
}

// handleAck completes the frame an ACK answers (if it went to that peer).
func (c *core) handleAck(from poll.PeerID, a *pdlinkv1.Ack) {
	p := c.out.take(a.GetAckedSeq(), from)
	if p == nil {
		return // a duplicate ACK, or for a frame already given up
	}
	res := AckResult{Result: a.GetResult(), Reason: a.GetReason()}
	if p.onAck == nil && !res.final() {
		// unknown_peer: the frame was not applied; register, then retry.
		c.hooks.unknownToPeer(p.dest)
		c.out.requeue(c.now(), p)
		return
	}
	if p.onAck != nil && !p.onAck(from, res) {
		if c.now() < p.giveUp {
			c.out.requeue(c.now(), p)
		}
	}
}

// decodeFrame decodes and validates one frame, counting a rejection.
func (c *core) decodeFrame(frame []byte, from string) (*pdlinkv1.Envelope, FrameType, bool) {
	env, err := c.codec.Decode(frame)
	if err != nil {
		r, _ := RejectReasonOf(err)
		c.reject(r, from, err)
		return nil, 0, false
	}
	ft, _ := FrameTypeOf(env)
	c.ctr.frames[Received][ft].Add(1)
	return env, ft, true
}

// reject counts a rejected frame and logs it, rate limited per reason.
func (c *core) reject(r RejectReason, from string, err error) {
	c.ctr.rejected[r].Add(1)
	if r == RejectDuplicate {
		// A retransmit that crossed its ACK: answered again, part of
		// at-least-once delivery, nothing for an operator to act on.
		c.log.Debug("frame rejected", zap.Stringer("reason", r), zap.String("from", from))
		return
	}
	if n, ok := c.limiter.Allow(r); ok {
		c.log.Warn("frame rejected", zap.Stringer("reason", r), zap.String("from", from), zap.Error(err), zap.Uint64("suppressed", n))
	}
}
