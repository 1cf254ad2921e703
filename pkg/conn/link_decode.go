package conn

import (
	"context"
	"fmt"
	"sync"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
)

// DecodeLink is decoded's link: one session per prefill address (dialed
// lazily, registered first, registered again after the prefill restarts),
// heartbeats and liveness, dedupe per prefill incarnation, GOODBYE and
// departures. It reaches the room side only through room.
//
// The codec, outbox, counters, clock, log and supervisor it uses are the
// shared Link's.
type DecodeLink struct {
	Link
	dataEndpoint string
	layouts      func() []*pdlinkv1.RegionLayout
	room         RoomSide

	smu      sync.Mutex
	sessions map[string]*PrefillSession // by bootstrap address
	byID     map[poll.PeerID]*PrefillSession
	nextID   poll.PeerID
	departed map[*PrefillSession]int64 // said goodbye: Conn open until then + a heartbeat bound
}

// NewDecodeLink returns the link of a decode node whose data listener is
// dataEndpoint (sent in REGISTER with the layouts read at each REGISTER).
// It delivers to room.
func NewDecodeLink(cfg Config, dataEndpoint string, layouts func() []*pdlinkv1.RegionLayout, room RoomSide) (*DecodeLink, error) {
	if err := validateEndpoint(dataEndpoint, cfg.Limits.withDefaults()); err != nil {
		return nil, fmt.Errorf("%w: DataEndpoint: %v", ErrBadArgument, err)
	}
	c, err := newCore(cfg, poll.Decode)
	if err != nil {
		return nil, err
	}
	l := &DecodeLink{Link: Link{c}, dataEndpoint: dataEndpoint, layouts: layouts, room: room,
		sessions: make(map[string]*PrefillSession), byID: make(map[poll.PeerID]*PrefillSession)}
	c.hooks = l
	return l, nil
}

// PrefillSession is the link to one prefill daemon address. Fields after
// addr are guarded by the link's smu. The room side holds one only as an
// opaque handle (Open re-reads its current peer id through the link).
type PrefillSession struct {
	l           *DecodeLink
	addr        string
	conn        Conn
	id          poll.PeerID // the PeerID rooms bound to the current instance carry
	instance    string      // "" until the first frame from it
	epoch       uint64
	registered  bool
	registering bool
	// stale: the layouts changed while a REGISTER was on its way; it goes
	// again once that one is answered.
	stale     bool
	lastHeard int64
	lastHB    int64
	up        bool
	farewell  bool // acknowledged our GOODBYE
	dd        *dedupe

	cancel context.CancelFunc // stops the receive worker (its prefill said goodbye)
}

// sessTarget is a session at one PeerID: frames queued for an instance
// that restarted are cancelled by that id.
type sessTarget struct {
	s  *PrefillSession
	id poll.PeerID
}

func (t sessTarget) PeerID() poll.PeerID { return t.id }

func (t sessTarget) transmit(frame []byte) error { return t.s.transmit(frame) }

// currentInstance is whichever instance of the prefill daemon the session
// talks to now. A METADATA goes there: when the prefill restarts, its room
// moves to the new instance (poll.EvPeerReplaced) and the frame follows,
// even one sent while the restart was being handled.
type currentInstance struct{ s *PrefillSession }

func (t currentInstance) PeerID() poll.PeerID {
	t.s.l.smu.Lock()
	defer t.s.l.smu.Unlock()
	return t.s.id
}

func (t currentInstance) transmit(frame []byte) error { return t.s.transmit(frame) }

func (s *PrefillSession) transmit(frame []byte) error {
	s.l.smu.Lock()
	c := s.conn
	s.l.smu.Unlock()
	if c == nil {
		return ErrClosed
	}
	return c.Send(noWait, frame)
}

// Session returns the session for addr, dialing it on first use.
func (l *DecodeLink) Session(addr string) (*PrefillSession, error) {
	l.smu.Lock()
	s := l.sessions[addr]
	if s != nil {
		l.smu.Unlock()
		return s, nil
	}
	if !l.started.Load() || l.closed.Load() {
		l.smu.Unlock()
		return nil, ErrClosedNode
	}
	conn, err := l.cfg.Transport.Dial(l.ctx, addr)
	if err != nil {
		l.smu.Unlock()
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	l.nextID++
	sctx, cancel := context.WithCancel(l.ctx)
	s = &PrefillSession{l: l, addr: addr, conn: conn, cancel: cancel, id: l.nextID, lastHeard: l.now(), up: true, dd: newDedupe(l.cfg.DedupeWindow)}
	l.sessions[addr], l.byID[s.id] = s, s
	l.smu.Unlock()
	l.log.Info("prefill session opened", zap.String("addr", addr), zap.Uint32("peer", uint32(s.id)))
	l.sup.Go("session "+addr, func(context.Context) error { return s.run(sctx) })
	l.register(s)
	return s, nil
}

// CurrentPeer is the PeerID of the instance the session talks to now.
func (l *DecodeLink) CurrentPeer(s *PrefillSession) poll.PeerID {
	l.smu.Lock()
	defer l.smu.Unlock()
	return s.id
}

// SessionOf returns the session whose instance is (or was, until its
// rooms moved) id.
func (l *DecodeLink) SessionOf(id poll.PeerID) (*PrefillSession, bool) {
	l.smu.Lock()
	defer l.smu.Unlock()
	s := l.byID[id]
	return s, s != nil
}

// Target returns where a frame to the prefill instance id goes, or false
// once that instance is gone (restarted or said goodbye).
func (l *DecodeLink) Target(id poll.PeerID) (Target, bool) {
	s, ok := l.SessionOf(id)
	if !ok {
		return nil, false
	}
	return sessTarget{s: s, id: id}, true
}

// SendFollowing sends env reliably to whichever instance the session talks
// to when each copy leaves (a METADATA follows its room across a prefill
// restart). An unknown_peer answer registers again and retries; every
// other answer goes to onAck, which returns false to retry.
func (l *DecodeLink) SendFollowing(s *PrefillSession, env *pdlinkv1.Envelope, key poll.Key, giveUp int64, want func() bool, onAck func(poll.PeerID, AckResult) bool) {
	l.sendReliable(currentInstance{s: s}, env, key, giveUp, want, func(from poll.PeerID, a AckResult) bool {
		if a.unknownPeer() {
			l.register(s) // prefill forgot us (restart or long loss): register, then retry
			return false
		}
		return onAck(from, a)
	})
}

// run is the supervised receive worker of a session: the reconnect loop.
// A dead Conn makes it fail; the supervisor runs it again, which dials
// again (with backoff) and registers again.
func (s *PrefillSession) run(ctx context.Context) error {
	l := s.l
	if ctx.Err() != nil {
		return nil // the session was closed (its prefill said goodbye)
	}
	l.smu.Lock()
	conn := s.conn
	l.smu.Unlock()
	if conn == nil {
		c, err := l.cfg.Transport.Dial(ctx, s.addr)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("redial %s: %w", s.addr, err)
		}
		l.smu.Lock()
		s.conn, s.registered, s.registering = c, false, false
		l.smu.Unlock()
		conn = c
		l.register(s)
	}
	for {
		frame, err := conn.Recv(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			l.smu.Lock()
			if s.conn == conn {
				s.conn = nil
			}
			l.smu.Unlock()
			_ = conn.Close()
			return fmt.Errorf("connection to %s: %w", s.addr, err)
		}
		l.handle(s, frame)
	}
}

// register sends REGISTER to the session's prefill unless one is already
// on its way. It is retried until acknowledged.
func (l *DecodeLink) register(s *PrefillSession) {
	if l.saidGoodbye.Load() {
		return // leaving: an unknown_peer answer must not make us a peer again
	}
	l.smu.Lock()
	if s.registering {
		l.smu.Unlock()
		return
	}
	s.registering = true
	t := sessTarget{s: s, id: s.id}
	l.smu.Unlock()
	env := &pdlinkv1.Envelope{Body: &pdlinkv1.Envelope_Register{Register: &pdlinkv1.Register{
		InstanceId: l.cfg.Instance, DataEndpoint: l.dataEndpoint, Layouts: l.layouts()}}}
	forever := int64(1) << 62
	l.sendReliable(t, env, poll.Key{}, forever, nil, func(_ poll.PeerID, a AckResult) bool {
		l.smu.Lock()
		if s.id != t.id {
			l.smu.Unlock()
			return true // the prefill restarted meanwhile; a new REGISTER is on its way
		}
		s.registering = false
		applied := a.Result == pdlinkv1.AckResult_ACK_RESULT_APPLIED
		if applied {
			s.registered = true
		}
		again := s.stale && applied
		s.stale = false
		l.smu.Unlock()
		if again {
			l.register(s) // it carried the layouts before the change
		}
		if !applied {
			l.log.Error("prefill refused registration", zap.String("addr", s.addr), zap.String("reason", a.Reason))
			return true
		}
		l.resendRegistered(t.id)
		return true
	})
}

// CloseSessions closes every session's Conn (the node stops).
func (l *DecodeLink) CloseSessions() {
	l.closeDeparted(0, true)
	l.smu.Lock()
	defer l.smu.Unlock()
	for _, s := range l.sessions {
		if s.conn != nil {
			_ = s.conn.Close()
			s.conn = nil
		}
	}
}

// Peers returns the prefill daemons this link talks to.
func (l *DecodeLink) Peers() []PeerInfo {
	l.smu.Lock()
	defer l.smu.Unlock()
	out := make([]PeerInfo, 0, len(l.sessions))
	for _, s := range l.sessions {
		out = append(out, PeerInfo{ID: s.id, Instance: s.instance, Epoch: s.epoch, Addr: s.addr, Up: s.up, LastHeard: l.wall(s.lastHeard)})
	}
	return out
}

// Counters returns the frame and peer counters.
func (l *DecodeLink) Counters() Counters {
	s := l.ctr.snapshot()
	l.smu.Lock()
	for _, x := range l.sessions {
		s.countPeer(x.up)
	}
	l.smu.Unlock()
	return s
}

func (l *DecodeLink) unknownToPeer(t Target) {
	if st, ok := t.(sessTarget); ok {
		l.register(st.s)
	}
}

// maintain sends heartbeats on every session (also to a lost prefill, so
// it is found again) and declares silent ones lost (R10).
func (l *DecodeLink) maintain(now int64) {
	l.closeDeparted(now, false)
	bound := int64(l.cfg.HeartbeatMisses) * int64(l.cfg.HeartbeatInterval)
	var lost []poll.PeerID
	var hb []sessTarget
	l.smu.Lock()
	for _, s := range l.sessions {
		if s.farewell {
			continue // it acknowledged our goodbye: it forgot us, we stay quiet
		}
		if s.up && now-s.lastHeard > bound {
			s.up = false
			lost = append(lost, s.id)
		}
		if now-s.lastHB >= int64(l.cfg.HeartbeatInterval) {
			s.lastHB = now
			hb = append(hb, sessTarget{s: s, id: s.id})
		}
	}
	l.smu.Unlock()
	for _, id := range lost {
		l.ctr.peerLost.Add(1)
		l.log.Warn("peer lost", zap.Uint32("peer", uint32(id)))
		l.room.PeerLost(id)
	}
	if len(lost) > 0 {
		l.out.wake()
	}
	if len(hb) > 0 {
		live := l.room.LiveRooms()
		for _, t := range hb {
			l.sendHeartbeat(t, live)
		}
	}
}

// handle processes one frame from a prefill session. A frame from a new
// instance with a higher epoch means the prefill restarted: we register
// again, and the room side moves or fails the rooms bound to the old
// instance (R10). ACKs, heartbeats, duplicates and GOODBYE end here; the
// other frames go to the room side.
func (l *DecodeLink) handle(s *PrefillSession, frame []byte) {
	env, ft, ok := l.decodeFrame(frame, s.addr)
	if !ok {
		return
	}
	if l.frameHook != nil {
		l.frameHook(ft)
	}
	seq := env.GetSeq()
	var restarted poll.PeerID
	l.smu.Lock()
	switch {
	case s.instance == "":
		s.instance, s.epoch = env.GetSenderInstance(), env.GetEpoch()
	case env.GetSenderInstance() != s.instance || env.GetEpoch() != s.epoch:
		if env.GetEpoch() <= s.epoch {
			l.smu.Unlock()
			l.reject(RejectStaleEpoch, s.addr, nil)
			return
		}
		restarted = s.id // stays in byID until its rooms moved or failed
		l.nextID++
		s.id = l.nextID
		l.byID[s.id] = s
		s.instance, s.epoch = env.GetSenderInstance(), env.GetEpoch()
		s.dd = newDedupe(l.cfg.DedupeWindow)
		s.registered, s.registering = false, false
	}
	s.lastHeard = l.now()
	if !s.up {
		s.up = true
		l.log.Info("peer is back", zap.String("addr", s.addr))
	}
	t := sessTarget{s: s, id: s.id}
	var dupAck AckResult
	dup, withOwner := false, false
	dd := s.dd
	if seq != 0 {
		dupAck, dup = dd.get(seq)
		withOwner = !dup && dd.heldByOwner(seq)
	}
	l.smu.Unlock()

	if restarted != poll.NoPeer {
		l.ctr.peerRestarts.Add(1)
		l.log.Warn("peer restarted", zap.String("addr", s.addr), zap.Uint32("old_peer", uint32(restarted)), zap.String("instance", env.GetSenderInstance()))
		// REGISTER first: the notices about the failed rooms (poll tells
		// the new instance, which may have applied a frame of one before
		// we saw the restart) follow it on the same connection.
		l.register(s)
		l.room.PeerRestarted(restarted, t.id)
		// What is left for the old instance (its REGISTER, notices about
		// its rooms) dies with it; METADATA follows the session.
		l.out.cancelPeer(restarted)
		l.smu.Lock()
		delete(l.byID, restarted)
		l.smu.Unlock()
	}
	if dup || withOwner {
		l.reject(RejectDuplicate, s.addr, nil)
		if dup {
			l.sendAck(t, seq, dupAck)
		} // else the first copy is with the owner: its ACK answers this one
		return
	}
	var a AckResult
	switch ft {
	case FrameAck:
		l.handleAck(t.id, env.GetAck())
		return
	case FrameHeartbeat:
		return
	case FrameGoodbye:
		a = l.handleGoodbye(s, t)
	default:
		l.deliverRoomFrame(l.room, t, s.addr, ft, env, len(frame), dd, &l.smu)
		return
	}
	l.finishFrame(t, s.addr, seq, a, func(seq uint64, a AckResult) {
		l.smu.Lock()
		s.dd.put(seq, a)
		l.smu.Unlock()
	})
}

// goodbyeTargets are the prefill daemons that registered us and were
// heard from within the heartbeat bound.
func (l *DecodeLink) goodbyeTargets() []Target {
	l.smu.Lock()
	defer l.smu.Unlock()
	var out []Target
	for _, s := range l.sessions {
		if s.up && s.registered {
			out = append(out, sessTarget{s: s, id: s.id})
		}
	}
	return out
}

func (l *DecodeLink) peerLost(id poll.PeerID) bool {
	l.smu.Lock()
	defer l.smu.Unlock()
	s := l.byID[id]
	return s == nil || !s.up
}

func (l *DecodeLink) farewell(t Target) {
	if st, ok := t.(sessTarget); ok {
		l.smu.Lock()
		st.s.farewell = true
		l.smu.Unlock()
	}
}

// handleGoodbye forgets a prefill session whose daemon is leaving: a
// later Open for that address dials a new session and registers anew. The
// session's Conn stays open for a heartbeat bound (closeDeparted) so
// a GOODBYE retransmitted after a lost ACK is answered from the dedupe
// window.
func (l *DecodeLink) handleGoodbye(s *PrefillSession, t sessTarget) AckResult {
	l.smu.Lock()
	if l.sessions[s.addr] != s || s.id != t.id {
		l.smu.Unlock()
		return AckApplied
	}
	delete(l.sessions, s.addr)
	delete(l.byID, s.id)
	if l.departed == nil {
		l.departed = make(map[*PrefillSession]int64)
	}
	l.departed[s] = l.now()
	instance := s.instance
	l.smu.Unlock()
	l.room.PeerGone(t.id, zap.String("addr", s.addr), zap.String("peer_instance", instance))
	return AckApplied
}

// closeDeparted closes the sessions that said goodbye more than a
// heartbeat bound before now (every one if all).
func (l *DecodeLink) closeDeparted(now int64, all bool) {
	bound := int64(l.cfg.HeartbeatMisses) * int64(l.cfg.HeartbeatInterval)
	var closing []*PrefillSession
	l.smu.Lock()
	for s, at := range l.departed {
		if all || now-at > bound {
			delete(l.departed, s)
			closing = append(closing, s)
		}
	}
	l.smu.Unlock()
	for _, s := range closing {
		s.close()
	}
}

// close stops the session's receive worker and its Conn.
func (s *PrefillSession) close() {
	if s.cancel != nil {
		s.cancel()
	}
	s.l.smu.Lock()
	c := s.conn
	s.conn = nil
	s.l.smu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// RegisterAgain sends REGISTER to every prefill daemon this link
// registered with, or is registering with (after that REGISTER is
// answered): the region layouts changed.
func (l *DecodeLink) RegisterAgain() {
	l.smu.Lock()
	var ss []*PrefillSession
	for _, s := range l.sessions {
		switch {
		case s.registering:
			s.stale = true
		case s.registered:
			ss = append(ss, s)
		}
	}
	l.smu.Unlock()
	for _, s := range ss {
		l.register(s)
	}
}
