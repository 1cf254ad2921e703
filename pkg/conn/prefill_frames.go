package conn

import (
	"errors"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
)

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
		DstPages: m.GetDstPages(), AuxIndex: m.GetAuxIndex(), PrefixLen: m.GetPrefixLen(), ExpectedRanks: int(m.GetExpectedSenders())}
	info := n.link.peerInfo(p)
	n.dp.Bind(info, md)
	return a
}

// The room side of the prefill link (roomSide, link.go).

// frameIn applies a room frame from the decode peer behind from.
func (n *PrefillNode) frameIn(from target, ft FrameType, env *pdlinkv1.Envelope) ackResult {
	p := from.(*decodePeer)
	if n.pcfg.roomFrameHook != nil {
		n.pcfg.roomFrameHook(p.id, env.GetSeq(), ft)
	}
	switch ft {
	case FrameMetadata:
		return n.handleMetadata(p, env.GetMetadata())
	case FrameAbort:
		ab := env.GetAbort()
		return n.handleAbort(p, poll.Key{Room: poll.RoomID(ab.GetRoomId()), Nonce: poll.Nonce(ab.GetNonce())}, ab.GetReason())
	case FrameStatus:
		return n.handleStatus(p, env.GetStatus())
	case FrameAbortAck:
		aa := env.GetAbortAck()
		n.log.Debug("abort acknowledged", zap.Uint64("room", aa.GetRoomId()), zap.String("peer", p.instance))
		return ackApplied
	}
	return ackResult{}
}

func (n *PrefillNode) peerLost(id poll.PeerID) {
	_ = n.step(poll.Event{Kind: poll.EvPeerLost, Peer: id})
}

func (n *PrefillNode) peerRestarted(old, _ poll.PeerID) {
	_ = n.step(poll.Event{Kind: poll.EvPeerRestarted, Peer: old})
}

func (n *PrefillNode) peerGone(id poll.PeerID, fields ...zap.Field) { n.peerDeparted(id, fields...) }

func (n *PrefillNode) liveRooms() uint32 { return uint32(n.Stats().Inflight) }

// handleAbort fails the room (or leaves an abort tombstone if it is not
// open yet, R4) and, once the data plane is fenced, sends ABORT_ACK. The
// frame's ACK does not wait for the fence: a reader never does.
func (c *core) handleAbort(dest target, key poll.Key, reason string) ackResult {
	r, _ := poll.ParseReason(reason)
	a, _ := c.stepFrame(poll.Event{Kind: poll.EvAbortRemote, Key: key, Peer: dest.peerID(), Reason: r})
	if a == ackApplied {
		c.afterFence(key, func() {
			env := &pdlinkv1.Envelope{Body: &pdlinkv1.Envelope_AbortAck{AbortAck: &pdlinkv1.AbortAck{RoomId: uint64(key.Room), Nonce: uint64(key.Nonce)}}}
			c.lk.send(dest, env, key, c.now()+int64(c.cfg.NotifyHorizon))
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
