package room

import (
	"context"
	"fmt"
	"sync/atomic"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

// SendMetadata tells the room's prefill daemon where one rank's pages go.
// The data plane's Expect runs first, then METADATA leaves and is retried
// (also while prefill answers NOT_OPEN: its open legitimately races ours)
// until prefill applies it, which moves the room to WaitingForInput, or
// the room's own deadline passes. A prefill that already ended the room
// answers ENDED and the room fails at once with its reason (R3). It
// returns without waiting for the ACK.
func (n *DecodeOwner) SendMetadata(room poll.RoomID, req MetadataRequest) error {
	rank := Rank{TP: req.Rank.TP, Size: max(req.Rank.Size, 1)}
	if err := conn.ValidateRank(rank.proto()); err != nil {
		return fmt.Errorf("%w: %v", conn.ErrBadArgument, err)
	}
	info, err := n.Get(room)
	if err != nil {
		return err
	}
	if info.State != poll.Bootstrapping && info.State != poll.WaitingForInput {
		// Name the visible state: a room failed but not yet fenced must not
		// read as Failed to the scheduler (I9).
		return fmt.Errorf("%w: %v", conn.ErrNotBootstrapping, info.Visible)
	}
	s, ok := n.link.SessionOf(info.Peer)
	if !ok {
		return fmt.Errorf("%w: no session for peer %d", conn.ErrClosedNode, info.Peer)
	}
	md := Metadata{Key: info.Key, Rank: rank, DstPages: req.DstPages, AuxIndex: req.AuxIndex, PrefixLen: req.PrefixLen, ExpectedRanks: max(info.Ranks, 1)}
	n.exec(func() {
		if rec := n.opens[room]; rec != nil && rec.key == info.Key {
			md.PrefillTP = rec.expected
		} else if rank.Size == 1 {
			md.PrefillTP = md.ExpectedRanks // a room of one rank counts the prefill ranks
		}
	})
	if err := n.dp.Expect(md); err != nil {
		return err
	}
	env := &pdlinkv1.Envelope{Body: &pdlinkv1.Envelope_Metadata{Metadata: &pdlinkv1.Metadata{
		RoomId: uint64(room), Nonce: uint64(info.Key.Nonce), Rank: rank.proto(),
		DstPages: req.DstPages, AuxIndex: req.AuxIndex, ExpectedSenders: uint32(md.ExpectedRanks), PrefixLen: req.PrefixLen}}}
	key := info.Key
	// acked is this rank's METADATA answered APPLIED: with several decode
	// ranks the room is WaitingForInput from the first rank's answer, and
	// each other rank's METADATA is retried until its own is.
	acked := new(atomic.Bool)
	multi := rank.Size > 1
	// Asked by the tick worker before each retransmit: it reads the
	// table, never waits for the owner's queue.
	want := func() bool {
		st, ok := n.roomStateNow(key.Room)
		return ok && (st == poll.Bootstrapping || multi && st == poll.WaitingForInput && !acked.Load())
	}
	n.link.SendFollowing(s, env, key, info.Deadline, want, func(from poll.PeerID, a conn.AckResult) bool {
		if a.Result == pdlinkv1.AckResult_ACK_RESULT_APPLIED {
			acked.Store(true)
		}
		if multi && a.Result == pdlinkv1.AckResult_ACK_RESULT_NOT_OPEN {
			return !want()
		}
		return n.metadataAcked(from, key, a)
	})
	return nil
}

// metadataAcked applies the answer of prefill instance from to a
// METADATA; false retries it. The link answered unknown_peer itself
// (register, then retry). It runs on the session's reader, so what it
// steps is posted to the owner, never waited for.
func (n *DecodeOwner) metadataAcked(from poll.PeerID, key poll.Key, a conn.AckResult) bool {
	var ev poll.Event
	switch a.Result {
	case pdlinkv1.AckResult_ACK_RESULT_APPLIED:
		ev = poll.Event{Kind: poll.EvMetadata, Key: key, Peer: from}
	case pdlinkv1.AckResult_ACK_RESULT_NOT_OPEN:
		st, ok := n.roomStateNow(key.Room)
		return !(ok && st == poll.Bootstrapping)
	case pdlinkv1.AckResult_ACK_RESULT_ENDED:
		if a.Reason == "" {
			return true
		}
		r, _ := poll.ParseReason(a.Reason)
		ev = poll.Event{Kind: poll.EvPeerStatus, Key: key, Peer: from, Reason: r}
	case pdlinkv1.AckResult_ACK_RESULT_REJECTED:
		reason := poll.ReasonInvalid
		if a.Reason == conn.RejectForeignRoom.String() {
			reason = poll.ReasonCollision
		}
		n.log.Warn("prefill rejected metadata", conn.RoomField(key), zap.String("reason", a.Reason))
		ev = poll.Event{Kind: poll.EvAbortLocal, Key: key, Reason: reason}
	default:
		return true
	}
	n.post(func() { n.applyOwned(func() { _ = n.t.Step(n.now(), ev) }) })
	return true
}

// OnProgress is the data plane's callback: a chunk of the room was
// written. Bytes arriving prove prefill applied our METADATA, so a lost
// ACK does not hold the room in Bootstrapping.
// Progress events are coalesced per room (postProgress).
func (n *DecodeOwner) OnProgress(key poll.Key) { n.postProgress(key, n.advanceOwned(key, false, 0)) }

// OnRankDone is the data plane's callback: every page and the aux row
// that prefill rank rank sends are written and verified (I8). When every
// expected rank is done the room is Success and prefill is told.
func (n *DecodeOwner) OnRankDone(key poll.Key, rank int) {
	if rank < 0 || rank >= poll.MaxRanks {
		return
	}
	n.advance(key, true, uint8(rank))
}

func (n *DecodeOwner) advance(key poll.Key, done bool, rank uint8) {
	n.post(n.advanceOwned(key, done, rank))
}

// advanceOwned is the owner input that steps a room's progress (and, if
// done, its rank's completion).
func (n *DecodeOwner) advanceOwned(key poll.Key, done bool, rank uint8) func() {
	return func() {
		n.applyOwned(func() {
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
		})
	}
}

// OnFailed is the data plane's callback: the room's transfer failed
// (transfer_error, checksum...). Prefill is told. It is an event
// nobody waits for: a transfer goroutine that reports a failure never
// waits for an owner that may be fencing it.
func (n *DecodeOwner) OnFailed(key poll.Key, reason poll.Reason) {
	n.post(func() {
		n.applyOwned(func() { _ = n.t.Step(n.now(), poll.Event{Kind: poll.EvAbortLocal, Key: key, Reason: reason}) })
	})
}

// Abort fails a room locally (reason "" = aborted:local), fences its
// writes and tells prefill (even before prefill opened it, R4). It
// returns once the room's Failed is visible, bounded by ctx; see the
// package doc, Aborting.
func (n *DecodeOwner) Abort(ctx context.Context, room poll.RoomID, reason poll.Reason) error {
	return n.abort(ctx, room, reason)
}

// Subscribe returns a subscription to visible transitions.
func (n *DecodeOwner) Subscribe(buf int) *Subscription { return n.subscribe(buf) }

// Peers returns the prefill daemons this node talks to.
func (n *DecodeOwner) Peers() []conn.PeerInfo { return n.link.Peers() }

// Counters returns the frame and peer counters.
func (n *DecodeOwner) Counters() conn.Counters { return n.link.Counters() }

func (n *DecodeOwner) notify(e poll.Effect) {
	dest, ok := n.link.Target(e.Peer)
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

// peerDeparted forgets the peer behind id, which said goodbye: rooms still
// bound to it fail as if its shutdown ABORT had arrived (aborted:remote,
// peer reason shutdown), frames queued for it are dropped, and it is
// counted as a goodbye, not as lost.
func (c *core) peerDeparted(id poll.PeerID, fields ...zap.Field) {
	dropped := c.lk.Departed(id)
	rooms := c.roomsBoundTo(id)
	c.log.Info("peer said goodbye", append(fields, zap.Uint32("peer", uint32(id)),
		zap.Int("rooms_failed", len(rooms)), zap.Int("frames_dropped", dropped))...)
	for _, k := range rooms {
		_ = c.step(poll.Event{Kind: poll.EvAbortRemote, Key: k, Peer: id, Reason: poll.ReasonShutdown})
	}
}

func (n *DecodeOwner) fence(k poll.Key) bool { return n.dp.Fence(k) }
func (n *DecodeOwner) forget(k poll.Key)     { n.dp.Forget(k) }

// The room side of the decode link (conn.RoomSide, through decodeSide).

// peerLost is posted, not waited for: the tick worker reports it.
func (n *DecodeOwner) peerLost(id poll.PeerID) {
	n.fromTickWorker(func() { n.applyOwned(func() { _ = n.t.Step(n.now(), poll.Event{Kind: poll.EvPeerLost, Peer: id}) }) })
}

func (n *DecodeOwner) peerRestarted(old, id poll.PeerID) {
	_ = n.step(poll.Event{Kind: poll.EvPeerReplaced, Peer: old, NewPeer: id})
}

func (n *DecodeOwner) peerGone(id poll.PeerID, fields ...zap.Field) { n.peerDeparted(id, fields...) }

func (n *DecodeOwner) liveRooms() uint32 { return n.liveRoomsNow() }

// decodeSide is the node as its link's conn.RoomSide (see prefillSide).
type decodeSide struct{ n *DecodeOwner }

func (s decodeSide) FrameIn(from conn.Target, ft conn.FrameType, env *pdlinkv1.Envelope, tok *conn.AckToken) bool {
	return s.n.deliver(tok, func() conn.AckResult { return s.n.frameIn(from, ft, env) })
}
func (s decodeSide) PeerLost(id poll.PeerID)                      { s.n.peerLost(id) }
func (s decodeSide) PeerRestarted(old, id poll.PeerID)            { s.n.peerRestarted(old, id) }
func (s decodeSide) PeerGone(id poll.PeerID, fields ...zap.Field) { s.n.peerGone(id, fields...) }
func (s decodeSide) LiveRooms() uint32                            { return s.n.liveRooms() }

// frameIn steps a room frame from the prefill instance behind from, on
// the owner goroutine (one input, deliver), and returns its ACK.
func (n *DecodeOwner) frameIn(from conn.Target, ft conn.FrameType, env *pdlinkv1.Envelope) conn.AckResult {
	if n.dcfg.roomFrameHook != nil {
		n.dcfg.roomFrameHook(from.PeerID(), env.GetSeq(), ft)
	}
	switch ft {
	case conn.FrameAbort:
		ab := env.GetAbort()
		return n.handleAbort(from, poll.Key{Room: poll.RoomID(ab.GetRoomId()), Nonce: poll.Nonce(ab.GetNonce())}, ab.GetReason())
	case conn.FrameStatus:
		st := env.GetStatus()
		if st.GetState() != pdlinkv1.RoomState_ROOM_STATE_FAILED {
			return conn.AckRejected(conn.RejectInvalid) // prefill never reports Success
		}
		r, _ := poll.ParseReason(st.GetReason())
		key := poll.Key{Room: poll.RoomID(st.GetRoomId()), Nonce: poll.Nonce(st.GetNonce())}
		a, _ := n.stepFrameOwned(poll.Event{Kind: poll.EvPeerStatus, Key: key, Peer: from.PeerID(), Reason: r})
		return a
	case conn.FrameAbortAck:
		aa := env.GetAbortAck()
		n.log.Debug("abort acknowledged", conn.RoomField(poll.Key{Room: poll.RoomID(aa.GetRoomId()), Nonce: poll.Nonce(aa.GetNonce())}), zap.Uint32("peer", uint32(from.PeerID())))
		return conn.AckApplied
	default: // REGISTER, METADATA: decode never receives them
		return conn.AckRejected(conn.RejectInvalid)
	}
}
