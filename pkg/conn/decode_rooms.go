package conn

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
)

// SendMetadata tells the room's prefill daemon where one rank's pages go.
// The data plane's Expect runs first, then METADATA leaves and is retried
// (also while prefill answers NOT_OPEN: its open legitimately races ours)
// until prefill applies it, which moves the room to WaitingForInput, or
// the room's own deadline passes. A prefill that already ended the room
// answers ENDED and the room fails at once with its reason (R3). It
// returns without waiting for the ACK.
func (n *DecodeNode) SendMetadata(room poll.RoomID, req MetadataRequest) error {
	rank := Rank{TP: req.Rank.TP, Size: max(req.Rank.Size, 1)}
	if err := validateRank(rank.proto()); err != nil {
		return fmt.Errorf("%w: %v", ErrBadArgument, err)
	}
	info, err := n.Get(room)
	if err != nil {
		return err
	}
	if info.State != poll.Bootstrapping && info.State != poll.WaitingForInput {
		// Name the visible state: a room failed but not yet fenced must not
		// read as Failed to the scheduler (I9).
		return fmt.Errorf("%w: %v", ErrNotBootstrapping, info.Visible)
	}
	n.smu.Lock()
	s := n.byID[info.Peer]
	n.smu.Unlock()
	if s == nil {
		return fmt.Errorf("%w: no session for peer %d", ErrClosedNode, info.Peer)
	}
	md := Metadata{Key: info.Key, Rank: rank, DstPages: req.DstPages, AuxIndex: req.AuxIndex, ExpectedRanks: max(info.Ranks, 1)}
	if err := n.dp.Expect(md); err != nil {
		return err
	}
	env := &pdlinkv1.Envelope{Body: &pdlinkv1.Envelope_Metadata{Metadata: &pdlinkv1.Metadata{
		RoomId: uint64(room), Nonce: uint64(info.Key.Nonce), Rank: rank.proto(),
		DstPages: req.DstPages, AuxIndex: req.AuxIndex, ExpectedSenders: uint32(md.ExpectedRanks)}}}
	key := info.Key
	want := func() bool {
		_, st, ok := n.roomDeadline(key.Room)
		return ok && st == poll.Bootstrapping
	}
	n.sendReliable(currentInstance{s: s}, env, key, info.Deadline, want, func(from poll.PeerID, a ackResult) bool {
		return n.metadataAcked(s, from, key, a)
	})
	return nil
}

// metadataAcked applies the answer of prefill instance from to a
// METADATA; false retries it.
func (n *DecodeNode) metadataAcked(s *prefillSession, from poll.PeerID, key poll.Key, a ackResult) bool {
	switch a.result {
	case pdlinkv1.AckResult_ACK_RESULT_APPLIED:
		_ = n.step(poll.Event{Kind: poll.EvMetadata, Key: key, Peer: from})
	case pdlinkv1.AckResult_ACK_RESULT_NOT_OPEN:
		_, st, ok := n.roomDeadline(key.Room)
		return !(ok && st == poll.Bootstrapping)
	case pdlinkv1.AckResult_ACK_RESULT_ENDED:
		if a.reason != "" {
			r, _ := poll.ParseReason(a.reason)
			_ = n.step(poll.Event{Kind: poll.EvPeerStatus, Key: key, Peer: from, Reason: r})
		}
	case pdlinkv1.AckResult_ACK_RESULT_REJECTED:
		if a.unknownPeer() {
			n.register(s) // prefill forgot us (restart or long loss): register, then retry
			return false
		}
		reason := poll.ReasonInvalid
		if a.reason == RejectForeignRoom.String() {
			reason = poll.ReasonCollision
		}
		n.log.Warn("prefill rejected metadata", zap.Uint64("room", uint64(key.Room)), zap.String("reason", a.reason))
		_ = n.step(poll.Event{Kind: poll.EvAbortLocal, Key: key, Reason: reason})
	}
	return true
}

// OnProgress is the data plane's callback: a chunk of the room was
// written. Bytes arriving prove prefill applied our METADATA, so a lost
// ACK does not hold the room in Bootstrapping.
func (n *DecodeNode) OnProgress(key poll.Key) { n.advance(key, false, 0) }

// OnRankDone is the data plane's callback: every page and the aux row
// that prefill rank rank sends are written and verified (I8). When every
// expected rank is done the room is Success and prefill is told.
func (n *DecodeNode) OnRankDone(key poll.Key, rank int) {
	if rank < 0 || rank >= poll.MaxRanks {
		return
	}
	n.advance(key, true, uint8(rank))
}

func (n *DecodeNode) advance(key poll.Key, done bool, rank uint8) {
	n.mu.Lock()
	now := n.now()
	if info, err := n.t.Get(key.Room); err == nil && info.Key.Nonce == key.Nonce {
		if info.State == poll.Bootstrapping {
			_ = n.t.Step(now, poll.Event{Kind: poll.EvMetadata, Key: key, Peer: info.Peer})
		}
		_ = n.t.Step(now, poll.Event{Kind: poll.EvFirstChunk, Key: key}) // or progress in Transferring
		if done {
			_ = n.t.Step(now, poll.Event{Kind: poll.EvDone, Key: key, Rank: rank})
		}
	}
	effs := n.takeLocked()
	n.mu.Unlock()
	n.perform(effs)
}

// OnFailed is the data plane's callback: the room's transfer failed
// (transfer_error, checksum...). Prefill is told.
func (n *DecodeNode) OnFailed(key poll.Key, reason poll.Reason) {
	_ = n.step(poll.Event{Kind: poll.EvAbortLocal, Key: key, Reason: reason})
}

// Abort fails a room locally (reason "" = aborted:local), fences its
// writes and tells prefill (even before prefill opened it, R4). It
// returns once the room's Failed is visible, bounded by ctx; see the
// package doc, Aborting.
func (n *DecodeNode) Abort(ctx context.Context, room poll.RoomID, reason poll.Reason) error {
	return n.abort(ctx, room, reason)
}

// Subscribe returns a subscription to visible transitions.
func (n *DecodeNode) Subscribe(buf int) *Subscription { return n.subscribe(buf) }

// Peers returns the prefill daemons this node talks to.
func (n *DecodeNode) Peers() []PeerInfo {
	n.smu.Lock()
	defer n.smu.Unlock()
	out := make([]PeerInfo, 0, len(n.sessions))
	for _, s := range n.sessions {
		out = append(out, PeerInfo{ID: s.id, Instance: s.instance, Epoch: s.epoch, Addr: s.addr, Up: s.up, LastHeard: n.wall(s.lastHeard)})
	}
	return out
}

// Counters returns the frame and peer counters.
func (n *DecodeNode) Counters() Counters {
	s := n.ctr.snapshot()
	n.smu.Lock()
	for _, x := range n.sessions {
		if x.up {
			s.PeersUp++
		} else {
			s.PeersDown++
		}
	}
	n.smu.Unlock()
	return s
}

func (n *DecodeNode) notify(e poll.Effect) {
	n.smu.Lock()
	s := n.byID[e.Peer]
	n.smu.Unlock()
	if s == nil {
		return // that prefill instance restarted: its rooms are gone
	}
	n.sendOutcome(sessTarget{s: s, id: e.Peer}, e)
}

// roomsBoundTo lists the live rooms bound to a peer id.
func (c *core) roomsBoundTo(id poll.PeerID) []poll.Key {
	var keys []poll.Key
	token := ""
	for {
		infos, next, err := c.List(poll.Filter{Peer: id}, token, 1000)
		if err != nil {
			return keys
		}
		for _, in := range infos {
			if !in.State.Terminal() {
				keys = append(keys, in.Key)
			}
		}
		if next == "" {
			return keys
		}
		token = next
	}
}

func (n *DecodeNode) unknownToPeer(t target) {
	if st, ok := t.(sessTarget); ok {
		n.register(st.s)
	}
}

func (n *DecodeNode) fence(k poll.Key) bool { return n.dp.Fence(k) }
func (n *DecodeNode) forget(k poll.Key)     { n.dp.Forget(k) }

// maintain sends heartbeats on every session (also to a lost prefill, so
// it is found again) and declares silent ones lost (R10).
func (n *DecodeNode) maintain(now int64) {
	n.closeDeparted(now, false)
	bound := int64(n.cfg.HeartbeatMisses) * int64(n.cfg.HeartbeatInterval)
	var lost []poll.PeerID
	var hb []sessTarget
	n.smu.Lock()
	for _, s := range n.sessions {
		if s.farewell {
			continue // it acknowledged our goodbye: it forgot us, we stay quiet
		}
		if s.up && now-s.lastHeard > bound {
			s.up = false
			lost = append(lost, s.id)
		}
		if now-s.lastHB >= int64(n.cfg.HeartbeatInterval) {
			s.lastHB = now
			hb = append(hb, sessTarget{s: s, id: s.id})
		}
	}
	n.smu.Unlock()
	for _, id := range lost {
		n.ctr.peerLost.Add(1)
		n.log.Warn("peer lost", zap.Uint32("peer", uint32(id)))
		_ = n.step(poll.Event{Kind: poll.EvPeerLost, Peer: id})
	}
	if len(hb) > 0 {
		live := uint32(n.Stats().Inflight)
		for _, t := range hb {
			n.sendHeartbeat(t, live)
		}
	}
}

// handle processes one frame from a prefill session. A frame from a new
// instance with a higher epoch means the prefill restarted: we register
// again, and each room bound to the old instance takes poll's
// EvPeerReplaced move: one whose METADATA the old instance never applied
// moves to the new instance and its METADATA goes again once the REGISTER
// is acknowledged; the others fail with peer_restarted at once (R10).
func (n *DecodeNode) handle(s *prefillSession, frame []byte) {
	env, ft, ok := n.decodeFrame(frame, s.addr)
	if !ok {
		return
	}
	if n.frameHook != nil {
		n.frameHook(ft)
	}
	seq := env.GetSeq()
	var restarted poll.PeerID
	n.smu.Lock()
	switch {
	case s.instance == "":
		s.instance, s.epoch = env.GetSenderInstance(), env.GetEpoch()
	case env.GetSenderInstance() != s.instance || env.GetEpoch() != s.epoch:
		if env.GetEpoch() <= s.epoch {
			n.smu.Unlock()
			n.reject(RejectStaleEpoch, s.addr, nil)
			return
		}
		restarted = s.id // stays in byID until its rooms moved or failed
		n.nextID++
		s.id = n.nextID
		n.byID[s.id] = s
		s.instance, s.epoch = env.GetSenderInstance(), env.GetEpoch()
		s.dd = newDedupe(n.cfg.DedupeWindow)
		s.registered, s.registering = false, false
	}
	s.lastHeard = n.now()
	if !s.up {
		s.up = true
		n.log.Info("peer is back", zap.String("addr", s.addr))
	}
	t := sessTarget{s: s, id: s.id}
	var dupAck ackResult
	dup := false
	if seq != 0 {
		dupAck, dup = s.dd.get(seq)
	}
	n.smu.Unlock()

	if restarted != poll.NoPeer {
		n.ctr.peerRestarts.Add(1)
		n.log.Warn("peer restarted", zap.String("addr", s.addr), zap.Uint32("old_peer", uint32(restarted)), zap.String("instance", env.GetSenderInstance()))
		// REGISTER first: the notices about the failed rooms (poll tells
		// the new instance, which may have applied a frame of one before
		// we saw the restart) follow it on the same connection.
		n.register(s)
		_ = n.step(poll.Event{Kind: poll.EvPeerReplaced, Peer: restarted, NewPeer: t.id})
		// What is left for the old instance (its REGISTER, notices about
		// its rooms) dies with it; METADATA follows the session.
		n.out.cancelPeer(restarted)
		n.smu.Lock()
		delete(n.byID, restarted)
		n.smu.Unlock()
	}
	if dup {
		n.reject(RejectDuplicate, s.addr, nil)
		n.sendAck(t, seq, dupAck)
		return
	}
	var a ackResult
	switch ft {
	case FrameAck:
		n.handleAck(t.id, env.GetAck())
		return
	case FrameHeartbeat:
		return
	case FrameAbort:
		ab := env.GetAbort()
		a = n.handleAbort(t, poll.Key{Room: poll.RoomID(ab.GetRoomId()), Nonce: poll.Nonce(ab.GetNonce())}, ab.GetReason())
	case FrameStatus:
		st := env.GetStatus()
		if st.GetState() != pdlinkv1.RoomState_ROOM_STATE_FAILED {
			a = ackRejected(RejectInvalid) // prefill never reports Success
			break
		}
		r, _ := poll.ParseReason(st.GetReason())
		key := poll.Key{Room: poll.RoomID(st.GetRoomId()), Nonce: poll.Nonce(st.GetNonce())}
		a, _ = n.stepFrame(poll.Event{Kind: poll.EvPeerStatus, Key: key, Peer: t.id, Reason: r})
	case FrameAbortAck:
		n.log.Debug("abort acknowledged", zap.Uint64("room", env.GetAbortAck().GetRoomId()), zap.String("addr", s.addr))
		a = ackApplied
	case FrameGoodbye:
		a = n.handleGoodbye(s, t)
	default: // REGISTER, METADATA: decode never receives them
		a = ackRejected(RejectInvalid)
	}
	n.finishFrame(t, s.addr, seq, a, func(seq uint64, a ackResult) {
		n.smu.Lock()
		s.dd.put(seq, a)
		n.smu.Unlock()
	})
}
