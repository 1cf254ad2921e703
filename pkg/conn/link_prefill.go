package conn

import (
	"context"
	"fmt"
	"sync"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
)

// PrefillLink is prefilld's link: the bootstrap socket and its listener
// worker, the registry of decode peers (learnt from REGISTER only, by
// instance, id and data endpoint), dedupe per peer incarnation, heartbeats
// and liveness, GOODBYE and departures. It reaches the room side only
// through room; the room side reaches peers only through its methods.
//
// The codec, outbox, counters, clock, log and supervisor it uses are the
// shared Link's.
type PrefillLink struct {
	Link
	acceptRegister func(PeerInfo) error
	room           RoomSide

	lnMu sync.Mutex
	ln   Listener
	addr string

	pmu        sync.Mutex
	peers      map[string]*decodePeer // by instance id
	byID       map[poll.PeerID]*decodePeer
	byEndpoint map[string]*decodePeer
	nextID     poll.PeerID
	departed   map[string]departure // by instance id: said goodbye (goodbye.go)
}

// NewPrefillLink returns the link of a prefill node that binds addr;
// acceptRegister, if set, vets a decode peer's REGISTER (an error rejects
// it as invalid). It delivers to room.
func NewPrefillLink(cfg Config, addr string, acceptRegister func(PeerInfo) error, room RoomSide) (*PrefillLink, error) {
	c, err := newCore(cfg, poll.Prefill)
	if err != nil {
		return nil, err
	}
	l := &PrefillLink{Link: Link{c}, addr: addr, acceptRegister: acceptRegister, room: room,
		peers: make(map[string]*decodePeer), byID: make(map[poll.PeerID]*decodePeer), byEndpoint: make(map[string]*decodePeer)}
	c.hooks = l
	return l, nil
}

// Bind binds the bootstrap socket; Listen starts its only reader once the
// workers run.
func (l *PrefillLink) Bind(ctx context.Context) error {
	ln, err := l.cfg.Transport.Listen(ctx, l.addr)
	if err != nil {
		return err
	}
	l.lnMu.Lock()
	l.ln, l.addr = ln, ln.Addr()
	l.lnMu.Unlock()
	return nil
}

// Addr returns the bound bootstrap address.
func (l *PrefillLink) Addr() string {
	l.lnMu.Lock()
	defer l.lnMu.Unlock()
	return l.addr
}

// CloseSocket closes the bootstrap socket (the node stops).
func (l *PrefillLink) CloseSocket() {
	l.lnMu.Lock()
	if l.ln != nil {
		_ = l.ln.Close()
		l.ln = nil
	}
	l.lnMu.Unlock()
}

// Target returns where a frame to decode peer id goes, or false once
// that peer restarted or was forgotten.
func (l *PrefillLink) Target(id poll.PeerID) (Target, bool) {
	l.pmu.Lock()
	defer l.pmu.Unlock()
	p := l.byID[id]
	if p == nil {
		return nil, false
	}
	return p, true
}

// PeerInfo describes the decode peer behind from (a Target this link
// delivered a frame with) for the data plane.
func (l *PrefillLink) PeerInfo(from Target) PeerInfo {
	l.pmu.Lock()
	defer l.pmu.Unlock()
	return from.(*decodePeer).infoLocked(l.core)
}

func (l *PrefillLink) unknownToPeer(Target) {}

// Listen starts the listener worker, the only reader of the bootstrap
// socket; its supervisor runs it again (re-binding the address) if the
// socket dies.
func (l *PrefillLink) Listen() { l.sup.Go("listener", l.listenLoop) }

// decodePeer is one registered decode instance. Fields after l are
// guarded by the link's pmu.
type decodePeer struct {
	l         *PrefillLink
	id        poll.PeerID
	instance  string
	epoch     uint64
	endpoint  string
	layouts   []*pdlinkv1.RegionLayout
	route     Route
	lastHeard int64
	lastHB    int64
	up        bool
	farewell  bool // acknowledged our GOODBYE
	dd        *dedupe
}

func (p *decodePeer) PeerID() poll.PeerID { return p.id }

func (p *decodePeer) transmit(frame []byte) error {
	p.l.pmu.Lock()
	route := p.route
	p.l.pmu.Unlock()
	return p.l.sendRoute(route, frame)
}

func (p *decodePeer) infoLocked(c *core) PeerInfo {
	return PeerInfo{ID: p.id, Instance: p.instance, Epoch: p.epoch, Addr: p.endpoint, Layouts: p.layouts, Up: p.up, LastHeard: c.wall(p.lastHeard)}
}

// routeTarget answers a dialer that is not a registered peer.
type routeTarget struct {
	l     *PrefillLink
	route Route
}

func (r routeTarget) PeerID() poll.PeerID         { return poll.NoPeer }
func (r routeTarget) transmit(frame []byte) error { return r.l.sendRoute(r.route, frame) }

func (l *PrefillLink) sendRoute(route Route, frame []byte) error {
	l.lnMu.Lock()
	ln := l.ln
	l.lnMu.Unlock()
	if ln == nil || route == "" {
		return ErrClosed
	}
	return ln.Send(noWait, route, frame)
}

// listenLoop is the supervised receive worker. When the socket dies it
// returns an error; the supervisor counts it and runs the loop again,
// which binds the address anew (R6, R12).
func (l *PrefillLink) listenLoop(ctx context.Context) error {
	l.lnMu.Lock()
	ln := l.ln
	l.lnMu.Unlock()
	if ln == nil {
		var err error
		if ln, err = l.cfg.Transport.Listen(ctx, l.Addr()); err != nil {
			return fmt.Errorf("rebind %s: %w", l.Addr(), err)
		}
		l.lnMu.Lock()
		l.ln = ln
		l.lnMu.Unlock()
		l.log.Info("bootstrap socket bound again", zap.String("addr", ln.Addr()))
	}
	for {
		route, frame, err := ln.Recv(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			l.lnMu.Lock()
			if l.ln == ln {
				l.ln = nil
			}
			l.lnMu.Unlock()
			_ = ln.Close()
			return fmt.Errorf("bootstrap socket: %w", err)
		}
		l.handle(route, frame)
	}
}

// Peers returns the registered decode peers.
func (l *PrefillLink) Peers() []PeerInfo {
	l.pmu.Lock()
	defer l.pmu.Unlock()
	out := make([]PeerInfo, 0, len(l.peers))
	for _, p := range l.peers {
		out = append(out, p.infoLocked(l.core))
	}
	return out
}

// Counters returns the frame and peer counters.
func (l *PrefillLink) Counters() Counters {
	s := l.ctr.snapshot()
	l.pmu.Lock()
	for _, p := range l.peers {
		s.countPeer(p.up)
	}
	l.pmu.Unlock()
	return s
}

// maintain sends heartbeats, declares silent peers lost (R10) and forgets
// peers lost for long.
func (l *PrefillLink) maintain(now int64) {
	bound := int64(l.cfg.HeartbeatMisses) * int64(l.cfg.HeartbeatInterval)
	var lost []poll.PeerID
	var hb []*decodePeer
	l.pmu.Lock()
	l.expireDeparturesLocked(now)
	for inst, p := range l.peers {
		if p.farewell {
			continue // it acknowledged our goodbye: it forgot us, we stay quiet
		}
		silent := now - p.lastHeard
		if p.up && silent > bound {
			p.up = false
			lost = append(lost, p.id)
		}
		if !p.up && silent > int64(l.cfg.PeerForgetAfter) {
			delete(l.peers, inst)
			delete(l.byID, p.id)
			if l.byEndpoint[p.endpoint] == p {
				delete(l.byEndpoint, p.endpoint)
			}
			continue
		}
		if now-p.lastHB >= int64(l.cfg.HeartbeatInterval) {
			p.lastHB = now
			hb = append(hb, p)
		}
	}
	l.pmu.Unlock()
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
		for _, p := range hb {
			l.sendHeartbeat(p, live)
		}
	}
}

// handle processes one frame from the bootstrap socket. It never returns
// an error: a bad frame is rejected, counted and, when it asked for one,
// answered; the listener goes on (R12).
func (l *PrefillLink) handle(route Route, frame []byte) {
	env, ft, ok := l.decodeFrame(frame, string(route))
	if !ok {
		return
	}
	if l.frameHook != nil {
		l.frameHook(ft)
	}
	seq := env.GetSeq()
	now := l.now()
	l.pmu.Lock()
	if l.departedLocked(env) {
		l.pmu.Unlock()
		l.answerDeparted(route, env, ft)
		return
	}
	p := l.peers[env.GetSenderInstance()]
	if p == nil || env.GetEpoch() != p.epoch {
		l.pmu.Unlock()
		l.handleStranger(route, env, ft, p)
		return
	}
	p.lastHeard = now
	if !p.up {
		p.up = true
		l.log.Info("peer is back", zap.String("peer", p.instance))
	}
	if seq != 0 {
		if a, dup := p.dd.get(seq); dup {
			l.pmu.Unlock()
			l.reject(RejectDuplicate, p.instance, nil)
			l.sendAck(p, seq, a)
			return
		}
		if p.dd.heldByOwner(seq) {
			// The first copy is still with the owner: its ACK answers
			// this one too, and it must not be applied twice.
			l.pmu.Unlock()
			l.reject(RejectDuplicate, p.instance, nil)
			return
		}
		// Only a fresh reliable frame may move where we answer this peer:
		// a replayed HEARTBEAT or ACK (seq 0) or a duplicate from another
		// connection must not redirect its frames to whoever replayed it.
		// A decode's DEALER keeps its identity across reconnects, so a
		// genuine peer's route does not change between REGISTERs anyway.
		p.route = route
	}
	l.pmu.Unlock()

	var a AckResult
	switch ft {
	case FrameRegister:
		a = l.updateRegistration(p, env.GetRegister())
	case FrameMetadata, FrameAbort, FrameStatus, FrameAbortAck:
		l.deliverRoomFrame(l.room, p, p.instance, ft, env, len(frame), p.dd, &l.pmu)
		return
	case FrameAck:
		l.handleAck(p.id, env.GetAck())
		return
	case FrameHeartbeat:
		return
	case FrameGoodbye:
		a = l.handleGoodbye(p)
	}
	l.finishFrame(p, p.instance, seq, a, func(seq uint64, a AckResult) {
		l.pmu.Lock()
		p.dd.put(seq, a)
		l.pmu.Unlock()
	})
}

// handleStranger handles a frame from an instance that is not (or no
// longer, at this epoch) registered: only REGISTER is accepted. A
// HEARTBEAT is answered with ours, so a decode daemon sees our epoch and
// registers again after we restarted.
func (l *PrefillLink) handleStranger(route Route, env *pdlinkv1.Envelope, ft FrameType, known *decodePeer) {
	rt := routeTarget{l: l, route: route}
	if known != nil && env.GetEpoch() < known.epoch {
		l.reject(RejectStaleEpoch, env.GetSenderInstance(), nil)
		return
	}
	switch ft {
	case FrameRegister:
		l.register(route, env)
	case FrameHeartbeat:
		l.reject(RejectUnknownPeer, env.GetSenderInstance(), nil)
		l.sendHeartbeat(rt, 0)
	case FrameAck:
		l.reject(RejectUnknownPeer, env.GetSenderInstance(), nil)
	default:
		l.reject(RejectUnknownPeer, env.GetSenderInstance(), nil)
		l.sendAck(rt, env.GetSeq(), AckRejected(RejectUnknownPeer))
	}
}

// register admits a new decode instance. Another instance at the same data
// endpoint with an older epoch is the same daemon restarted: every room
// bound to it fails with peer_restarted at once (R10).
func (l *PrefillLink) register(route Route, env *pdlinkv1.Envelope) {
	reg := env.GetRegister()
	rt := routeTarget{l: l, route: route}
	info := PeerInfo{Instance: reg.GetInstanceId(), Epoch: env.GetEpoch(), Addr: reg.GetDataEndpoint(), Layouts: reg.GetLayouts(), Up: true}
	if l.acceptRegister != nil {
		if err := l.acceptRegister(info); err != nil {
			l.reject(RejectInvalid, info.Instance, err)
			l.sendAck(rt, env.GetSeq(), AckRejected(RejectInvalid))
			return
		}
	}
	now := l.now()
	var replaced []poll.PeerID
	l.pmu.Lock()
	if old := l.peers[info.Instance]; old != nil {
		// Same instance, newer epoch: a restart that kept its id.
		replaced = append(replaced, old.id)
		l.dropPeerLocked(old)
	}
	if old := l.byEndpoint[info.Addr]; old != nil {
		if old.epoch >= info.Epoch {
			l.pmu.Unlock()
			l.reject(RejectStaleEpoch, info.Instance, nil)
			l.sendAck(rt, env.GetSeq(), AckRejected(RejectStaleEpoch))
			return
		}
		replaced = append(replaced, old.id)
		l.dropPeerLocked(old)
	}
	if len(l.peers) >= l.cfg.MaxPeers {
		l.pmu.Unlock()
		l.reject(RejectTooManyPeers, info.Instance, nil)
		l.sendAck(rt, env.GetSeq(), AckRejected(RejectTooManyPeers))
		return
	}
	l.nextID++
	if l.nextID == poll.NoPeer {
		l.nextID++
	}
	p := &decodePeer{l: l, id: l.nextID, instance: info.Instance, epoch: info.Epoch, endpoint: info.Addr, layouts: info.Layouts,
		route: route, lastHeard: now, up: true, dd: newDedupe(l.cfg.DedupeWindow)}
	l.peers[p.instance], l.byID[p.id], l.byEndpoint[p.endpoint] = p, p, p
	p.dd.put(env.GetSeq(), AckApplied)
	l.pmu.Unlock()

	for _, id := range replaced {
		l.ctr.peerRestarts.Add(1)
		l.out.cancelPeer(id)
		l.log.Warn("peer restarted", zap.Uint32("old_peer", uint32(id)), zap.String("instance", p.instance), zap.String("endpoint", p.endpoint))
		l.room.PeerRestarted(id, poll.NoPeer)
	}
	l.log.Info("peer registered", zap.String("peer", p.instance), zap.String("endpoint", p.endpoint), zap.Uint32("id", uint32(p.id)))
	l.sendAck(p, env.GetSeq(), AckApplied)
}

func (l *PrefillLink) dropPeerLocked(p *decodePeer) {
	delete(l.peers, p.instance)
	delete(l.byID, p.id)
	if l.byEndpoint[p.endpoint] == p {
		delete(l.byEndpoint, p.endpoint)
	}
}

// updateRegistration handles a REGISTER from a peer already registered at
// this epoch (a retry after its ACK was lost): idempotent.
func (l *PrefillLink) updateRegistration(p *decodePeer, reg *pdlinkv1.Register) AckResult {
	l.pmu.Lock()
	defer l.pmu.Unlock()
	if reg.GetDataEndpoint() != p.endpoint {
		return AckRejected(RejectInvalid) // an instance does not move its data endpoint
	}
	p.layouts = reg.GetLayouts()
	return AckApplied
}

// goodbyeTargets are the decode peers heard from within the heartbeat
// bound.
func (l *PrefillLink) goodbyeTargets() []Target {
	l.pmu.Lock()
	defer l.pmu.Unlock()
	var out []Target
	for _, p := range l.peers {
		if p.up {
			out = append(out, p)
		}
	}
	return out
}

func (l *PrefillLink) peerLost(id poll.PeerID) bool {
	l.pmu.Lock()
	defer l.pmu.Unlock()
	p := l.byID[id]
	return p == nil || !p.up
}

func (l *PrefillLink) farewell(t Target) {
	if p, ok := t.(*decodePeer); ok {
		l.pmu.Lock()
		p.farewell = true
		l.pmu.Unlock()
	}
}

// handleGoodbye forgets a registered decode peer that is leaving. A
// repeat (our ACK was lost) finds it gone and changes nothing.
func (l *PrefillLink) handleGoodbye(p *decodePeer) AckResult {
	l.pmu.Lock()
	if l.peers[p.instance] != p {
		l.pmu.Unlock()
		return AckApplied
	}
	l.dropPeerLocked(p)
	l.departLocked(p.instance, p.epoch, l.now())
	l.pmu.Unlock()
	l.room.PeerGone(p.id, zap.String("peer_instance", p.instance), zap.String("endpoint", p.endpoint))
	return AckApplied
}

// departLocked remembers a departed incarnation, bounded by MaxPeers (the
// oldest goes first) and by PeerForgetAfter (see expireDeparturesLocked).
func (l *PrefillLink) departLocked(instance string, epoch uint64, now int64) {
	if l.departed == nil {
		l.departed = make(map[string]departure)
	}
	if _, ok := l.departed[instance]; !ok && len(l.departed) >= l.cfg.MaxPeers {
		oldest, at := "", int64(0)
		for inst, d := range l.departed {
			if oldest == "" || d.at < at {
				oldest, at = inst, d.at
			}
		}
		delete(l.departed, oldest)
	}
	l.departed[instance] = departure{epoch: epoch, at: now}
}

func (l *PrefillLink) expireDeparturesLocked(now int64) {
	for inst, d := range l.departed {
		if now-d.at > int64(l.cfg.PeerForgetAfter) {
			delete(l.departed, inst)
		}
	}
}

// departedLocked reports whether env comes from an incarnation that said
// goodbye (a newer one is a new peer).
func (l *PrefillLink) departedLocked(env *pdlinkv1.Envelope) bool {
	d, ok := l.departed[env.GetSenderInstance()]
	return ok && env.GetEpoch() <= d.epoch
}

// answerDeparted handles a frame from a departed incarnation: its GOODBYE
// again is a duplicate, acknowledged (idempotent); its HEARTBEATs and ACKs
// until it hears that ACK are expected and dropped; any other frame is
// refused as stale_epoch without an answer, so it cannot register again.
func (l *PrefillLink) answerDeparted(route Route, env *pdlinkv1.Envelope, ft FrameType) {
	switch ft {
	case FrameGoodbye:
		l.reject(RejectDuplicate, env.GetSenderInstance(), nil) // as a duplicate of a live peer's would be
		l.sendAck(routeTarget{l: l, route: route}, env.GetSeq(), AckApplied)
	case FrameHeartbeat, FrameAck:
	default:
		l.reject(RejectStaleEpoch, env.GetSenderInstance(), nil)
	}
}
