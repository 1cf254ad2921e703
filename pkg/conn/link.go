package conn

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
)

// The link/room seam. A link (prefillLink in link_prefill.go, decodeLink in
// link_decode.go) owns the transport side: sockets and sessions, the codec,
// validation, reliable delivery (reliable.go: seq, ACK, retransmit,
// dedupe), peers, REGISTER, heartbeats and liveness, GOODBYE and
// departures. The room side (PrefillNode, DecodeNode with core.go,
// fence.go, read.go, drain.go and the room frame handlers) owns the
// poll.Table and everything that steps it. The link reaches the room side
// only through roomSide; the room side reaches peers only through its
// link's methods (target, sendFollowing, session, peers, counters) and the
// opaque target handles the link hands it.

// linkBase is the link machinery both links share and the calls the room
// code (core.go, fence.go, read.go, drain.go, the room frame handlers)
// makes into it: reliable sends, the REGISTER wait of rebound rooms and
// the unacknowledged room notices a drain waits for. The codec, outbox,
// counters and supervisor are still fields of core; only link code and
// these methods touch them.
type linkBase struct{ *core }

// send sends env reliably to dest until it is acknowledged or giveUp.
func (l linkBase) send(dest target, env *pdlinkv1.Envelope, key poll.Key, giveUp int64) {
	l.sendReliable(dest, env, key, giveUp, nil, nil)
}

// rebound marks the frames about key to go again as soon as their peer
// acknowledges our REGISTER (poll moved the room to a restarted peer's
// new instance).
func (l linkBase) rebound(key poll.Key) { l.out.awaitRegister(key) }

// unackedRoomFrames counts the frames about rooms not acknowledged yet.
func (l linkBase) unackedRoomFrames() int { return l.out.roomFrames() }

// frameAcked is closed the next time a frame leaves the outbox.
func (l linkBase) frameAcked() <-chan struct{} {
	l.out.mu.Lock()
	defer l.out.mu.Unlock()
	return l.out.removed
}

// awaitRoomFramesAcked waits until every frame about a room is
// acknowledged (or given up), or ctx ends.
func (l linkBase) awaitRoomFramesAcked(ctx context.Context) {
	l.out.waitUntil(ctx, func() bool { return l.out.roomFrames() == 0 })
}

// departed forgets what is queued for a peer that said goodbye, counts
// the goodbye and returns the number of frames dropped.
func (l linkBase) departed(id poll.PeerID) int {
	l.ctr.peerGoodbyes.Add(1)
	return l.out.cancelPeer(id)
}

// roomSide is what a link delivers to its room side and asks of it. Every
// delivery is a direct call on the goroutine that read the frame (the
// listener worker, a session's receive worker) or on the tick worker; the
// owner goroutine of PLAN step 3 turns these calls into Events. A peer's
// frames are delivered one at a time in the order its connection
// delivered them, duplicates never.
type roomSide interface {
	// frameIn is a valid, non-duplicate room frame (METADATA, ABORT,
	// STATUS, ABORT_ACK, or one this side never receives) from the peer
	// behind from; its answer is the frame's ACK. from is the handle to
	// send replies about the frame to.
	frameIn(from target, ft FrameType, env *pdlinkv1.Envelope) ackResult
	// peerLost: the peer id was silent for HeartbeatMisses intervals.
	peerLost(id poll.PeerID)
	// peerRestarted: a new incarnation replaced old. On decode the
	// session goes on as id (REGISTER to it already on its way); on
	// prefill id is NoPeer (the new one registered as a new peer). The
	// old incarnation's queued frames are dropped (before this call on
	// prefill, right after it on decode).
	peerRestarted(old, id poll.PeerID)
	// peerGone: the peer id said goodbye; the link forgot it.
	peerGone(id poll.PeerID, fields ...zap.Field)
	// liveRooms is the live-room count heartbeats carry.
	liveRooms() uint32
}

// finishFrame counts a rejection, remembers a final answer and sends it.
func (c *core) finishFrame(dest target, from string, seq uint64, a ackResult, remember func(uint64, ackResult)) {
	if a.result == pdlinkv1.AckResult_ACK_RESULT_REJECTED {
		r := RejectInvalid
		for _, x := range AllRejectReasons() {
			if x.String() == a.reason {
				r = x
			}
		}
		c.reject(r, from, nil)
	}
	if seq == 0 {
		return
	}
	if a.final() {
		remember(seq, a)
	}
	c.sendAck(dest, seq, a)
}

// sendHeartbeat sends one HEARTBEAT (best effort) carrying live rooms.
func (c *core) sendHeartbeat(dest target, live uint32) {
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
func (c *core) transmit(dest target, env *pdlinkv1.Envelope) ([]byte, error) {
	frame, err := c.codec.Encode(env)
	if err != nil {
		c.ctr.sendErrors.Add(1)
		c.log.Error("cannot encode frame", zap.Error(err))
		return nil, err
	}
	c.send(dest, env, frame)
	return frame, nil
}

func (c *core) send(dest target, env *pdlinkv1.Envelope, frame []byte) {
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
func (c *core) sendReliable(dest target, env *pdlinkv1.Envelope, key poll.Key, giveUp int64, want func() bool, onAck func(poll.PeerID, ackResult) bool) {
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
		c.log.Debug("reliable frame abandoned at its deadline", zap.Stringer("type", p.ft), zap.Uint64("seq", p.seq), zap.Uint64("room", uint64(p.key.Room)))
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
func (c *core) sendAck(dest target, seq uint64, a ackResult) {
	env := c.envelope(0)
	env.Body = &pdlinkv1.Envelope_Ack{Ack: &pdlinkv1.Ack{AckedSeq: seq, Result: a.result, Reason: a.reason}}
	_, _ = c.transmit(dest, env)
}

// handleAck completes the frame an ACK answers (if it went to that peer).
func (c *core) handleAck(from poll.PeerID, a *pdlinkv1.Ack) {
	p := c.out.take(a.GetAckedSeq(), from)
	if p == nil {
		return // a duplicate ACK, or for a frame already given up
	}
	res := ackResult{result: a.GetResult(), reason: a.GetReason()}
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
	if n, ok := c.limiter.allow(r); ok {
		c.log.Warn("frame rejected", zap.Stringer("reason", r), zap.String("from", from), zap.Error(err), zap.Uint64("suppressed", n))
	}
}

// logLimiter lets one log line per reason through per second and counts
// the others.
type logLimiter struct {
	clock      Clock
	mu         sync.Mutex
	last       [numRejectReasons]time.Time
	suppressed [numRejectReasons]uint64
}

func (l *logLimiter) allow(r RejectReason) (uint64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.clock.Now()
	if !l.last[r].IsZero() && now.Sub(l.last[r]) < time.Second {
		l.suppressed[r]++
		return 0, false
	}
	n := l.suppressed[r]
	l.last[r], l.suppressed[r] = now, 0
	return n, true
}
