package conn

import (
	"errors"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
)

// handle processes one frame from the bootstrap socket. It never returns
// an error: a bad frame is rejected, counted and, when it asked for one,
// answered; the listener goes on (R12).
func (n *PrefillNode) handle(route Route, frame []byte) {
	env, ft, ok := n.decodeFrame(frame, string(route))
	if !ok {
		return
	}
	if n.frameHook != nil {
		n.frameHook(ft)
	}
	seq := env.GetSeq()
	now := n.now()
	n.pmu.Lock()
	if n.departedLocked(env) {
		n.pmu.Unlock()
		n.answerDeparted(route, env, ft)
		return
	}
	p := n.peers[env.GetSenderInstance()]
	if p == nil || env.GetEpoch() != p.epoch {
		n.pmu.Unlock()
		n.handleStranger(route, env, ft, p)
		return
	}
	p.lastHeard = now
	if !p.up {
		p.up = true
		n.log.Info("peer is back", zap.String("peer", p.instance))
	}
	if seq != 0 {
		if a, dup := p.dd.get(seq); dup {
			n.pmu.Unlock()
			n.reject(RejectDuplicate, p.instance, nil)
			n.sendAck(p, seq, a)
			return
		}
		// Only a fresh reliable frame may move where we answer this peer:
		// a replayed HEARTBEAT or ACK (seq 0) or a duplicate from another
		// connection must not redirect its frames to whoever replayed it.
		// A decode's DEALER keeps its identity across reconnects, so a
		// genuine peer's route does not change between REGISTERs anyway.
		p.route = route
	}
	n.pmu.Unlock()

	var a ackResult
	switch ft {
	case FrameRegister:
		a = n.updateRegistration(p, env.GetRegister())
	case FrameMetadata:
		a = n.handleMetadata(p, env.GetMetadata())
	case FrameAbort:
		ab := env.GetAbort()
		a = n.handleAbort(p, poll.Key{Room: poll.RoomID(ab.GetRoomId()), Nonce: poll.Nonce(ab.GetNonce())}, ab.GetReason())
	case FrameStatus:
		a = n.handleStatus(p, env.GetStatus())
	case FrameAbortAck:
		aa := env.GetAbortAck()
		n.log.Debug("abort acknowledged", zap.Uint64("room", aa.GetRoomId()), zap.String("peer", p.instance))
		a = ackApplied
	case FrameAck:
		n.handleAck(p.id, env.GetAck())
		return
	case FrameHeartbeat:
		return
	case FrameGoodbye:
		a = n.handleGoodbye(p)
	}
	n.finishFrame(p, p.instance, seq, a, func(seq uint64, a ackResult) {
		n.pmu.Lock()
		p.dd.put(seq, a)
		n.pmu.Unlock()
	})
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

// handleStranger handles a frame from an instance that is not (or no
// longer, at this epoch) registered: only REGISTER is accepted. A
// HEARTBEAT is answered with ours, so a decode daemon sees our epoch and
// registers again after we restarted.
func (n *PrefillNode) handleStranger(route Route, env *pdlinkv1.Envelope, ft FrameType, known *decodePeer) {
	rt := routeTarget{n: n, route: route}
	if known != nil && env.GetEpoch() < known.epoch {
		n.reject(RejectStaleEpoch, env.GetSenderInstance(), nil)
		return
	}
	switch ft {
	case FrameRegister:
		n.register(route, env)
	case FrameHeartbeat:
		n.reject(RejectUnknownPeer, env.GetSenderInstance(), nil)
		n.sendHeartbeat(rt, 0)
	case FrameAck:
		n.reject(RejectUnknownPeer, env.GetSenderInstance(), nil)
	default:
		n.reject(RejectUnknownPeer, env.GetSenderInstance(), nil)
		n.sendAck(rt, env.GetSeq(), ackRejected(RejectUnknownPeer))
	}
}

// register admits a new decode instance. Another instance at the same data
// endpoint with an older epoch is the same daemon restarted: every room
// bound to it fails with peer_restarted at once (R10).
func (n *PrefillNode) register(route Route, env *pdlinkv1.Envelope) {
	reg := env.GetRegister()
	rt := routeTarget{n: n, route: route}
	info := PeerInfo{Instance: reg.GetInstanceId(), Epoch: env.GetEpoch(), Addr: reg.GetDataEndpoint(), Layouts: reg.GetLayouts(), Up: true}
	if n.pcfg.AcceptRegister != nil {
		if err := n.pcfg.AcceptRegister(info); err != nil {
			n.reject(RejectInvalid, info.Instance, err)
			n.sendAck(rt, env.GetSeq(), ackRejected(RejectInvalid))
			return
		}
	}
	now := n.now()
	var replaced []poll.PeerID
	n.pmu.Lock()
	if old := n.peers[info.Instance]; old != nil {
		// Same instance, newer epoch: a restart that kept its id.
		replaced = append(replaced, old.id)
		n.dropPeerLocked(old)
	}
	if old := n.byEndpoint[info.Addr]; old != nil {
		if old.epoch >= info.Epoch {
			n.pmu.Unlock()
			n.reject(RejectStaleEpoch, info.Instance, nil)
			n.sendAck(rt, env.GetSeq(), ackRejected(RejectStaleEpoch))
			return
		}
		replaced = append(replaced, old.id)
		n.dropPeerLocked(old)
	}
	if len(n.peers) >= n.cfg.MaxPeers {
		n.pmu.Unlock()
		n.reject(RejectTooManyPeers, info.Instance, nil)
		n.sendAck(rt, env.GetSeq(), ackRejected(RejectTooManyPeers))
		return
	}
	n.nextID++
	if n.nextID == poll.NoPeer {
		n.nextID++
	}
	p := &decodePeer{n: n, id: n.nextID, instance: info.Instance, epoch: info.Epoch, endpoint: info.Addr, layouts: info.Layouts,
		route: route, lastHeard: now, up: true, dd: newDedupe(n.cfg.DedupeWindow)}
	n.peers[p.instance], n.byID[p.id], n.byEndpoint[p.endpoint] = p, p, p
	p.dd.put(env.GetSeq(), ackApplied)
	n.pmu.Unlock()

	for _, id := range replaced {
		n.ctr.peerRestarts.Add(1)
		n.out.cancelPeer(id)
		n.log.Warn("peer restarted", zap.Uint32("old_peer", uint32(id)), zap.String("instance", p.instance), zap.String("endpoint", p.endpoint))
		_ = n.step(poll.Event{Kind: poll.EvPeerRestarted, Peer: id})
	}
	n.log.Info("peer registered", zap.String("peer", p.instance), zap.String("endpoint", p.endpoint), zap.Uint32("id", uint32(p.id)))
	n.sendAck(p, env.GetSeq(), ackApplied)
}

func (n *PrefillNode) dropPeerLocked(p *decodePeer) {
	delete(n.peers, p.instance)
	delete(n.byID, p.id)
	if n.byEndpoint[p.endpoint] == p {
		delete(n.byEndpoint, p.endpoint)
	}
}

// updateRegistration handles a REGISTER from a peer already registered at
// this epoch (a retry after its ACK was lost): idempotent.
func (n *PrefillNode) updateRegistration(p *decodePeer, reg *pdlinkv1.Register) ackResult {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	if reg.GetDataEndpoint() != p.endpoint {
		return ackRejected(RejectInvalid) // an instance does not move its data endpoint
	}
	p.layouts = reg.GetLayouts()
	return ackApplied
}

// handleMetadata binds a room to the decode peer (EvMetadata) and hands
// the destination to the data plane. Late metadata for a room that ended
// here is answered ENDED with its reason and creates nothing (R3).
func (n *PrefillNode) handleMetadata(p *decodePeer, m *pdlinkv1.Metadata) ackResult {
	key := poll.Key{Room: poll.RoomID(m.GetRoomId()), Nonce: poll.Nonce(m.GetNonce())}
	// expected_senders is the frame's name for the ranks expected; the
	// wire keeps it for compatibility.
	a, err := n.stepFrame(poll.Event{Kind: poll.EvMetadata, Key: key, Peer: p.id, Ranks: uint8(m.GetExpectedSenders())})
	if a != ackApplied || !(err == nil || errors.Is(err, poll.ErrIllegalTransition)) {
		return a
	}
	md := Metadata{Key: key, Rank: rankOf(m.GetRank()),
		DstPages: m.GetDstPages(), AuxIndex: m.GetAuxIndex(), ExpectedRanks: int(m.GetExpectedSenders())}
	n.pmu.Lock()
	info := p.infoLocked(n.core)
	n.pmu.Unlock()
	n.dp.Bind(info, md)
	return a
}

// handleAbort fails the room (or leaves an abort tombstone if it is not
// open yet, R4) and, once the data plane is fenced, sends ABORT_ACK. The
// frame's ACK does not wait for the fence: a reader never does.
func (c *core) handleAbort(dest target, key poll.Key, reason string) ackResult {
	r, _ := poll.ParseReason(reason)
	a, _ := c.stepFrame(poll.Event{Kind: poll.EvAbortRemote, Key: key, Peer: dest.peerID(), Reason: r})
	if a == ackApplied {
		c.afterFence(key, func() {
			env := &pdlinkv1.Envelope{Body: &pdlinkv1.Envelope_AbortAck{AbortAck: &pdlinkv1.AbortAck{RoomId: uint64(key.Room), Nonce: uint64(key.Nonce)}}}
			c.sendReliable(dest, env, key, c.now()+int64(c.cfg.NotifyHorizon), nil, nil)
		})
	}
	return a
}

func (n *PrefillNode) handleAbort(p *decodePeer, key poll.Key, reason string) ackResult {
	return n.core.handleAbort(p, key, reason)
}

// handleStatus applies decode's STATUS: Success completes every rank of
// the room (decode reports Success once all of them are in place, I8);
// Failed fails it.
func (n *PrefillNode) handleStatus(p *decodePeer, s *pdlinkv1.Status) ackResult {
	key := poll.Key{Room: poll.RoomID(s.GetRoomId()), Nonce: poll.Nonce(s.GetNonce())}
	if s.GetState() == pdlinkv1.RoomState_ROOM_STATE_FAILED {
		r, _ := poll.ParseReason(s.GetReason())
		a, _ := n.stepFrame(poll.Event{Kind: poll.EvPeerStatus, Key: key, Peer: p.id, Reason: r})
		return a
	}
	ranks := 1
	if info, err := n.Get(key.Room); err == nil && info.Key == key && info.Peer == p.id {
		ranks = max(info.Ranks, 1)
		if info.State == poll.WaitingForInput {
			// Decode has every page: the scheduler's Send happened even if
			// its FirstSend has not reached us yet.
			_ = n.step(poll.Event{Kind: poll.EvFirstChunk, Key: key})
		}
	}
	var a ackResult
	for rank := range ranks {
		a, _ = n.stepFrame(poll.Event{Kind: poll.EvDone, Key: key, Peer: p.id, Rank: uint8(rank)})
		if a != ackApplied {
			break
		}
	}
	return a
}
