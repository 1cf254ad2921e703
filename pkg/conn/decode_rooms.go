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
	s, ok := n.link.sessionOf(info.Peer)
	if !ok {
		return fmt.Errorf("%w: no session for peer %d", ErrClosedNode, info.Peer)
	}
	md := Metadata{Key: info.Key, Rank: rank, DstPages: req.DstPages, AuxIndex: req.AuxIndex, PrefixLen: req.PrefixLen, ExpectedRanks: max(info.Ranks, 1)}
	if err := n.dp.Expect(md); err != nil {
		return err
	}
	env := &pdlinkv1.Envelope{Body: &pdlinkv1.Envelope_Metadata{Metadata: &pdlinkv1.Metadata{
		RoomId: uint64(room), Nonce: uint64(info.Key.Nonce), Rank: rank.proto(),
		DstPages: req.DstPages, AuxIndex: req.AuxIndex, ExpectedSenders: uint32(md.ExpectedRanks), PrefixLen: req.PrefixLen}}}
	key := info.Key
	want := func() bool {
		_, st, ok := n.roomDeadline(key.Room)
		return ok && st == poll.Bootstrapping
	}
	n.link.sendFollowing(s, env, key, info.Deadline, want, func(from poll.PeerID, a ackResult) bool {
		return n.metadataAcked(from, key, a)
	})
	return nil
}

// metadataAcked applies the answer of prefill instance from to a
// METADATA; false retries it. The link answered unknown_peer itself
// (register, then retry).
func (n *DecodeNode) metadataAcked(from poll.PeerID, key poll.Key, a ackResult) bool {
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
func (n *DecodeNode) Peers() []PeerInfo { return n.link.peerInfos() }

// Counters returns the frame and peer counters.
func (n *DecodeNode) Counters() Counters { return n.link.counters() }

func (n *DecodeNode) notify(e poll.Effect) {
	dest, ok := n.link.target(e.Peer)
	if !ok {
		return // that prefill instance restarted: its rooms are gone
	}
	n.sendOutcome(dest, e)
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

func (n *DecodeNode) unknownToPeer(t target)   { n.link.unknownToPeer(t) }
func (n *DecodeNode) maintain(now int64)       { n.link.maintain(now) }
func (n *DecodeNode) goodbyeTargets() []target { return n.link.goodbyeTargets() }
func (n *DecodeNode) farewell(t target)        { n.link.farewell(t) }

func (n *DecodeNode) fence(k poll.Key) bool { return n.dp.Fence(k) }
func (n *DecodeNode) forget(k poll.Key)     { n.dp.Forget(k) }

// The room side of the decode link (roomSide, link.go).

func (n *DecodeNode) peerLost(id poll.PeerID) {
	_ = n.step(poll.Event{Kind: poll.EvPeerLost, Peer: id})
}

func (n *DecodeNode) peerRestarted(old, id poll.PeerID) {
	_ = n.step(poll.Event{Kind: poll.EvPeerReplaced, Peer: old, NewPeer: id})
}

func (n *DecodeNode) peerGone(id poll.PeerID, fields ...zap.Field) { n.peerDeparted(id, fields...) }

func (n *DecodeNode) liveRooms() uint32 { return uint32(n.Stats().Inflight) }

// frameIn applies a room frame from the prefill instance behind from.
func (n *DecodeNode) frameIn(from target, ft FrameType, env *pdlinkv1.Envelope) ackResult {
	if n.dcfg.roomFrameHook != nil {
		n.dcfg.roomFrameHook(from.peerID(), env.GetSeq(), ft)
	}
	switch ft {
	case FrameAbort:
		ab := env.GetAbort()
		return n.handleAbort(from, poll.Key{Room: poll.RoomID(ab.GetRoomId()), Nonce: poll.Nonce(ab.GetNonce())}, ab.GetReason())
	case FrameStatus:
		st := env.GetStatus()
		if st.GetState() != pdlinkv1.RoomState_ROOM_STATE_FAILED {
			return ackRejected(RejectInvalid) // prefill never reports Success
		}
		r, _ := poll.ParseReason(st.GetReason())
		key := poll.Key{Room: poll.RoomID(st.GetRoomId()), Nonce: poll.Nonce(st.GetNonce())}
		a, _ := n.stepFrame(poll.Event{Kind: poll.EvPeerStatus, Key: key, Peer: from.peerID(), Reason: r})
		return a
	case FrameAbortAck:
		n.log.Debug("abort acknowledged", zap.Uint64("room", env.GetAbortAck().GetRoomId()), zap.Uint32("peer", uint32(from.peerID())))
		return ackApplied
	default: // REGISTER, METADATA: decode never receives them
		return ackRejected(RejectInvalid)
	}
}
