package room

import (
	"errors"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

// handleMetadata binds a room to the decode peer (EvMetadata) and hands
// the destination to the data plane. Late metadata for a room that ended
// here is answered ENDED with its reason and creates nothing (R3).
func (n *PrefillOwner) handleMetadata(p conn.Target, m *pdlinkv1.Metadata) conn.AckResult {
	key := poll.Key{Room: poll.RoomID(m.GetRoomId()), Nonce: poll.Nonce(m.GetNonce())}
	// expected_senders is the frame's name for the ranks expected; the
	// wire keeps it for compatibility.
	md := Metadata{Key: key, Rank: rankOf(m.GetRank()),
		DstPages: m.GetDstPages(), AuxIndex: m.GetAuxIndex(), PrefixLen: m.GetPrefixLen(), ExpectedRanks: int(m.GetExpectedSenders())}
	info := n.link.PeerInfo(p)
	// Applied and bound in one input: a Send that sees the room
	// WaitingForInput finds its binding.
	ev := poll.Event{Kind: poll.EvMetadata, Key: key, Peer: p.PeerID(), Ranks: uint8(m.GetExpectedSenders())}
	if md.Rank.Size > 1 {
		// One METADATA per decode rank, all for this daemon (it serves every
		// prefill rank): the room waits for input once each one arrived.
		ev.Addressed, ev.Rank = uint8(min(md.Rank.Size, poll.MaxRanks)), uint8(min(md.Rank.TP, poll.MaxRanks))
	}
	// Before the step: the transition it publishes carries the prefix.
	n.withTable(func() { n.notePrefixLocked(md) })
	a, err := n.stepFrameOwned(ev)
	if a == conn.AckApplied && (err == nil || errors.Is(err, poll.ErrIllegalTransition)) {
		n.dp.Bind(info, md)
	}
	return a
}

// The room side of the prefill link (conn.RoomSide, through prefillSide).

// frameIn steps a room frame from the decode peer behind from, on the
// owner goroutine (one input, deliver), and returns its ACK.
func (n *PrefillOwner) frameIn(from conn.Target, ft conn.FrameType, env *pdlinkv1.Envelope) conn.AckResult {
	p := from
	if n.pcfg.roomFrameHook != nil {
		n.pcfg.roomFrameHook(p.PeerID(), env.GetSeq(), ft)
	}
	switch ft {
	case conn.FrameMetadata:
		return n.handleMetadata(p, env.GetMetadata())
	case conn.FrameAbort:
		ab := env.GetAbort()
		return n.handleAbort(p, poll.Key{Room: poll.RoomID(ab.GetRoomId()), Nonce: poll.Nonce(ab.GetNonce())}, ab.GetReason())
	case conn.FrameStatus:
		return n.handleStatus(p, env.GetStatus())
	case conn.FrameAbortAck:
		aa := env.GetAbortAck()
		n.log.Debug("abort acknowledged", conn.RoomField(poll.Key{Room: poll.RoomID(aa.GetRoomId()), Nonce: poll.Nonce(aa.GetNonce())}), zap.String("peer", n.link.PeerInfo(p).Instance))
		return conn.AckApplied
	}
	return conn.AckResult{}
}

// peerLost is posted, not waited for: the tick worker reports it.
func (n *PrefillOwner) peerLost(id poll.PeerID) {
	n.fromTickWorker(func() { n.applyOwned(func() { _ = n.t.Step(n.now(), poll.Event{Kind: poll.EvPeerLost, Peer: id}) }) })
}

func (n *PrefillOwner) peerRestarted(old, _ poll.PeerID) {
	_ = n.step(poll.Event{Kind: poll.EvPeerRestarted, Peer: old})
}

func (n *PrefillOwner) peerGone(id poll.PeerID, fields ...zap.Field) { n.peerDeparted(id, fields...) }

func (n *PrefillOwner) liveRooms() uint32 { return n.liveRoomsNow() }

// prefillSide is the node as its link's conn.RoomSide: the link delivers
// through it, and the node's own API does not carry the delivery calls.
type prefillSide struct{ n *PrefillOwner }

func (s prefillSide) FrameIn(from conn.Target, ft conn.FrameType, env *pdlinkv1.Envelope, tok *conn.AckToken) bool {
	return s.n.deliver(tok, func() conn.AckResult { return s.n.frameIn(from, ft, env) })
}
func (s prefillSide) PeerLost(id poll.PeerID)                      { s.n.peerLost(id) }
func (s prefillSide) PeerRestarted(old, id poll.PeerID)            { s.n.peerRestarted(old, id) }
func (s prefillSide) PeerGone(id poll.PeerID, fields ...zap.Field) { s.n.peerGone(id, fields...) }
func (s prefillSide) LiveRooms() uint32                            { return s.n.liveRooms() }

// handleAbort fails the room (or leaves an abort tombstone if it is not
// open yet, R4) and, once the data plane is fenced, sends ABORT_ACK. The
// frame's ACK does not wait for the fence: a reader never does.
func (c *core) handleAbort(dest conn.Target, key poll.Key, reason string) conn.AckResult {
	r, _ := poll.ParseReason(reason)
	a, _ := c.stepFrameOwned(poll.Event{Kind: poll.EvAbortRemote, Key: key, Peer: dest.PeerID(), Reason: r})
	if a == conn.AckApplied {
		c.afterFence(key, func() {
			env := &pdlinkv1.Envelope{Body: &pdlinkv1.Envelope_AbortAck{AbortAck: &pdlinkv1.AbortAck{RoomId: uint64(key.Room), Nonce: uint64(key.Nonce)}}}
			c.lk.Send(dest, env, key, c.now()+int64(c.cfg.NotifyHorizon))
		})
	}
	return a
}

func (n *PrefillOwner) handleAbort(p conn.Target, key poll.Key, reason string) conn.AckResult {
	return n.core.handleAbort(p, key, reason)
}

// handleStatus applies decode's STATUS: Success completes every rank of
// the room (decode reports Success once all of them are in place, I8);
// Failed fails it.
func (n *PrefillOwner) handleStatus(p conn.Target, s *pdlinkv1.Status) conn.AckResult {
	key := poll.Key{Room: poll.RoomID(s.GetRoomId()), Nonce: poll.Nonce(s.GetNonce())}
	if s.GetState() == pdlinkv1.RoomState_ROOM_STATE_FAILED {
		r, _ := poll.ParseReason(s.GetReason())
		a, _ := n.stepFrameOwned(poll.Event{Kind: poll.EvPeerStatus, Key: key, Peer: p.PeerID(), Reason: r})
		return a
	}
	ranks := 1
	var info poll.RoomInfo
	var err error
	n.withTable(func() { info, err = n.t.Get(key.Room) })
	if err == nil && info.Key == key && info.Peer == p.PeerID() {
		ranks = max(info.Ranks, 1)
		if info.State == poll.WaitingForInput {
			// Decode has every page: the scheduler's Send happened even if
			// its FirstSend has not reached us yet.
			n.applyOwned(func() { _ = n.t.Step(n.now(), poll.Event{Kind: poll.EvFirstChunk, Key: key}) })
		}
	}
	var a conn.AckResult
	for rank := range ranks {
		a, _ = n.stepFrameOwned(poll.Event{Kind: poll.EvDone, Key: key, Peer: p.PeerID(), Rank: uint8(rank)})
		if a != conn.AckApplied {
			break
		}
	}
	return a
}
