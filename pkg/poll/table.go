package poll

import (
	"time"

	"github.com/pdlink/pdlink/pkg/inflight"
)

// Table is the room table of one daemon: rooms keyed by room id (one room
// per id at a time) and nonce, their deadlines, the peer index and the
// tombstones. It is not safe for concurrent use: one owner calls every
// method (see doc.go).
type Table struct {
	cfg   Config
	now   int64 // latest time seen; never goes back
	rooms map[RoomID]*room
	q     *inflight.Queue[*room]
	peers map[PeerID]*room // head of each peer's list of live rooms

	tombs map[RoomID]*tomb // chain per room id
	tq    *inflight.Queue[*tomb]

	effects   []Effect
	freeRooms []*room
	freeTombs []*tomb
	ctr       counters
}

// New returns an empty table for cfg.
func New(cfg Config) (*Table, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	deadlines := make([]time.Duration, len(stateOfClass))
	for c, s := range stateOfClass {
		deadlines[c] = cfg.deadline(s)
	}
	q, err := inflight.New[*room](inflight.Config{Deadlines: deadlines, OverdueFraction: cfg.OverdueFraction})
	if err != nil {
		return nil, err
	}
	tq, err := inflight.New[*tomb](inflight.Config{
		Deadlines:       []time.Duration{cfg.TombstoneTTL, cfg.TombstoneTTL},
		OverdueFraction: 1,
	})
	if err != nil {
		return nil, err
	}
	return &Table{
		cfg:   cfg,
		rooms: make(map[RoomID]*room),
		q:     q,
		peers: make(map[PeerID]*room),
		tombs: make(map[RoomID]*tomb),
		tq:    tq,
	}, nil
}

// Config returns the table's configuration.
func (t *Table) Config() Config { return t.cfg }

// Now returns the latest time the table has seen.
func (t *Table) Now() int64 { return t.now }

// clock clamps now so time never goes backwards within the table.
func (t *Table) clock(now int64) int64 {
	if now < t.now {
		return t.now
	}
	t.now = now
	return now
}

// Step applies one event at time now (monotonic nanoseconds). Deadlines up
// to now are expired first, so no room is ever seen past its deadline. The
// effects are appended to the pending batch (Ready). A rejected event
// changes no state, is counted, and returns a sentinel error.
func (t *Table) Step(now int64, ev Event) error {
	now = t.clock(now)
	t.expire(now)
	if err := t.validate(&ev); err != nil {
		return err
	}
	switch ev.Kind {
	case EvOpen:
		return t.open(now, &ev)
	case EvPeerLost, EvPeerRestarted:
		t.failPeer(now, &ev)
		return nil
	case EvPeerReplaced:
		t.replacePeer(now, &ev)
		return nil
	case EvShutdown:
		t.shutdown(now, &ev)
		return nil
	}
	r, err := t.lookup(now, &ev)
	if r == nil {
		return err // unknown room: answered, or an abort tombstone (nil)
	}
	return t.apply(now, r, &ev)
}

// Tick expires every deadline up to now: live rooms fail with
// timeout:<state> (I5), terminal rooms nobody cleared are reaped (I7),
// tombstones past their TTL go. It also refreshes the overdue counts.
func (t *Table) Tick(now int64) {
	now = t.clock(now)
	t.expire(now)
	t.q.AdvanceOverdue(now)
}

// NextDeadline returns the earliest pending deadline (a room's or a
// tombstone's), so a driver may sleep until then instead of ticking.
func (t *Table) NextDeadline() (int64, bool) {
	a, okA := t.q.NextDeadline()
	b, okB := t.tq.NextDeadline()
	switch {
	case okA && okB:
		return min(a, b), true
	case okA:
		return a, true
	}
	return b, okB
}

// Ready returns the effects produced since the last Advance. The slice is
// owned by the table and valid until the next Step, Tick or Advance.
func (t *Table) Ready() []Effect { return t.effects }

// Advance acknowledges the effects returned by Ready.
func (t *Table) Advance() {
	clear(t.effects)
	t.effects = t.effects[:0]
}

func (t *Table) emit(e Effect) { t.effects = append(t.effects, e) }

// validate rejects malformed events before they touch any state.
func (t *Table) validate(ev *Event) error {
	ok := ev.Kind > evNone && int(ev.Kind) < numEventKinds && ev.Kind != EvTimeout &&
		uint64(ev.Key.Room) < 1<<63 && ev.Ranks <= MaxRanks && ev.Rank < MaxRanks && ev.Addressed <= MaxRanks
	if ok && ev.Kind.fromPeer() && ev.Key.Nonce == 0 {
		ok = false
	}
	if ok && ev.Reason != ReasonNone {
		c, known := codeOf(ev.Reason)
		ok = known && c != codeUncleared &&
			(ev.Kind == EvAbortLocal || ev.Kind == EvAbortRemote || ev.Kind == EvPeerStatus)
	}
	if ok && (ev.Kind == EvPeerLost || ev.Kind == EvPeerRestarted || ev.Kind == EvPeerReplaced) && ev.Peer == NoPeer {
		ok = false
	}
	if ok && ev.Kind == EvPeerReplaced {
		// Only decode's Bootstrapping says the peer holds nothing for the
		// room; on prefill the decode peer holds every room from its Open.
		ok = t.cfg.Side == Decode && ev.NewPeer != NoPeer && ev.NewPeer != ev.Peer
	} else if ok && ev.NewPeer != NoPeer {
		ok = false
	}
	if !ok {
		t.reject(rejInvalid)
		return ErrInvalidEvent
	}
	return nil
}

// open creates a room: the only way state is ever created (I3).
func (t *Table) open(now int64, ev *Event) error {
	if r := t.rooms[ev.Key.Room]; r != nil {
		if r.key.Nonce == ev.Key.Nonce {
			t.reject(rejAlreadyExists)
			return ErrAlreadyExists
		}
		t.reject(rejCollision)
		t.ctr.collisions++
		return ErrCollision
	}
	if len(t.rooms) >= t.cfg.MaxRooms {
		t.reject(rejExhausted)
		return ErrResourceExhausted
	}
	r := t.newRoom()
	r.key, r.peer, r.ranks, r.createdAt = ev.Key, ev.Peer, ev.Ranks, now
	t.rooms[r.key.Room] = r
	if tb, ok := t.takeAborts(ev.Key); ok {
		// I4: the abort came first; the room is born Failed. No worker ever
		// ran, so it is born fenced and visible.
		r.state, r.visible, r.fenced, r.enteredAt = Failed, Failed, true, now
		r.reason, r.peerReason = tb.reason, tb.peerReason
		if r.key.Nonce == 0 {
			r.key.Nonce = tb.key.Nonce
		}
		t.q.Push(&r.entry, classOf[Failed], now)
		r.record(t.cfg.HistoryLen, now, StateNone, Failed, r.reason)
		t.ctr.transitions[StateNone][Failed]++
		t.ctr.failures[r.reason]++
		t.emit(Effect{Kind: EffTransition, Key: r.key, Peer: r.peer, From: StateNone, To: Failed, Visible: true, Reason: r.reason.reason(), PeerReason: r.peerReason.reason(), At: now,
			Opened: now, Entered: now})
		if r.peer != NoPeer && r.reason != codeAbortedRemote {
			// A local abort that came before the open: the peer this room
			// is bound to has not heard of it yet (R4, R8).
			t.emit(Effect{Kind: EffNotifyPeer, Key: r.key, Peer: r.peer, Status: Failed, Reason: r.reason.reason(), At: now})
		}
		return nil
	}
	r.state, r.visible, r.enteredAt = Bootstrapping, Bootstrapping, now
	t.q.Push(&r.entry, classOf[Bootstrapping], now)
	t.linkPeer(r)
	r.record(t.cfg.HistoryLen, now, StateNone, Bootstrapping, codeNone)
	t.ctr.transitions[StateNone][Bootstrapping]++
	t.emit(Effect{Kind: EffTransition, Key: r.key, Peer: r.peer, From: StateNone, To: Bootstrapping, Visible: true, At: now, Opened: now, Entered: now})
	return nil
}

// lookup finds the room an event is about and checks nonce and peer.
func (t *Table) lookup(now int64, ev *Event) (*room, error) {
	r := t.rooms[ev.Key.Room]
	if r == nil {
		return nil, t.unknown(now, ev)
	}
	// From here on a nil room always comes with an error.
	if n := ev.Key.Nonce; n != 0 && n != r.key.Nonce {
		if r.key.Nonce != 0 {
			t.reject(rejNonce)
			if ev.Peer != NoPeer && !isFailKind(ev.Kind) {
				// Another request's frame: tell its sender it collided.
				t.ctr.collisions++
				t.emit(Effect{Kind: EffNotifyPeer, Key: ev.Key, Peer: ev.Peer, Status: Failed, Reason: ReasonCollision, At: now})
			}
			return nil, ErrNonceMismatch
		}
		// Unbound room (prefill before METADATA): a frame of a request that
		// ended here with exactly this nonce is late, not for this room.
		if tb := t.findEnded(ev.Key, true); tb != nil {
			t.reject(rejEnded)
			t.replyEnded(now, ev, tb)
			return nil, ErrRoomEnded
		}
	}
	if ev.Peer != NoPeer && r.peer != NoPeer && ev.Peer != r.peer && ev.Kind != EvClear {
		t.reject(rejPeer)
		return nil, ErrPeerMismatch
	}
	return r, nil
}

func isFailKind(k EventKind) bool {
	return k == EvAbortLocal || k == EvAbortRemote || k == EvPeerStatus
}

// unknown handles an event for a room id not in the table. It never creates
// a room (I3): an abort leaves a tombstone (I4), a late frame for a room
// that ended is answered with its outcome (R2, R3), anything else is
// answered NotOpen.
//
// A failure with a nonce is about that request only, so only the ended
// tombstone of that exact key swallows it: a room that ended unbound
// (nonce 0) never learned which request it was, and the early ABORT of
// the next request with its id (decode opened and aborted before prefill
// opened) must leave its abort tombstone, or prefill's room waits out its
// bootstrap deadline. Other frames still match an unbound tombstone (R3:
// decode's late METADATA is answered Ended), and the tombstone learns the
// nonce it answered: that request was told it ended, so its later frames
// (its ABORT too) are recognised as late, and another nonce's are not its.
func (t *Table) unknown(now int64, ev *Event) error {
	fail := isFailKind(ev.Kind)
	if tb := t.findEnded(ev.Key, fail && ev.Key.Nonce != 0); tb != nil {
		t.reject(rejEnded)
		if !fail {
			if tb.key.Nonce == 0 && ev.Peer != NoPeer {
				tb.key.Nonce = ev.Key.Nonce
			}
			t.replyEnded(now, ev, tb)
		}
		return ErrRoomEnded
	}
	if fail {
		local, peer := failureReason(StateNone, ev)
		t.addAbort(now, ev.Key, local, peer)
		return nil
	}
	t.reject(rejUnknown)
	if ev.Peer != NoPeer {
		t.emit(Effect{Kind: EffReplyUnknown, Key: ev.Key, Peer: ev.Peer, Reply: ReplyNotOpen, At: now})
	}
	return ErrNotFound
}

func (t *Table) replyEnded(now int64, ev *Event, tb *tomb) {
	if ev.Peer == NoPeer {
		return
	}
	t.emit(Effect{Kind: EffReplyUnknown, Key: ev.Key, Peer: ev.Peer, Reply: ReplyEnded, Status: tb.state, Reason: tb.reason.reason(), At: now})
}

// expire fails live rooms past their deadline (I5), reaps terminal rooms
// past the clear linger (I7) and drops tombstones past their TTL.
func (t *Table) expire(now int64) {
	for e := t.q.NextExpired(now); e != nil; e = t.q.NextExpired(now) {
		r := e.Value
		if r.state.Terminal() {
			t.ctr.reaped++
			t.remove(now, r, EffReaped, codeUncleared)
			continue
		}
		t.fail(now, r, timeoutReason(r.state), true)
	}
	for e := t.tq.NextExpired(now); e != nil; e = t.tq.NextExpired(now) {
		t.ctr.tombsExpired++
		t.removeTomb(e.Value)
	}
}

// remove finalises a terminal room in one go (I6): room map, inflight
// queue, peer index, then an ended tombstone so late frames are answered.
func (t *Table) remove(now int64, r *room, kind EffectKind, why reasonCode) {
	delete(t.rooms, r.key.Room)
	t.q.Remove(&r.entry)
	t.unlinkPeer(r)
	t.addEnded(now, r)
	t.emit(Effect{Kind: kind, Key: r.key, Peer: r.peer, From: r.state, Status: r.state, Reason: why.reason(), At: now})
	t.freeRoom(r)
}

// failPeer fails every live room bound to the peer (R10).
func (t *Table) failPeer(now int64, ev *Event) {
	reason := codePeerLost
	if ev.Kind == EvPeerRestarted {
		reason = codePeerRestarted
	}
	for r := t.peers[ev.Peer]; r != nil; r = t.peers[ev.Peer] {
		t.fail(now, r, reason, false) // unlinks r
	}
}

// replacePeer applies EvPeerReplaced to every live room bound to the old
// instance (R10): the move table moves a room the old instance held
// nothing for to the new instance, and fails the others with
// peer_restarted. The new instance is told about those: it may have
// applied a frame about one (and sent bytes) before this side saw the
// restart.
func (t *Table) replacePeer(now int64, ev *Event) {
	for r := t.peers[ev.Peer]; r != nil; r = t.peers[ev.Peer] {
		if moves[r.state][EvPeerReplaced].rebind {
			t.unlinkPeer(r)
			r.peer = ev.NewPeer
			t.linkPeer(r)
			t.ctr.rebound++
			t.emit(Effect{Kind: EffRebound, Key: r.key, Peer: r.peer, Status: r.state, At: now})
			continue
		}
		t.fail(now, r, codePeerRestarted, false) // unlinks r
		t.emit(Effect{Kind: EffNotifyPeer, Key: r.key, Peer: ev.NewPeer, Status: Failed, Reason: ReasonPeerRestarted, At: now})
	}
}

// shutdown fails every live room with reason shutdown and tells the peers.
func (t *Table) shutdown(now int64, ev *Event) {
	for _, s := range [...]State{Bootstrapping, WaitingForInput, Transferring} {
		for e := t.q.Oldest(classOf[s]); e != nil; e = t.q.Oldest(classOf[s]) {
			t.fail(now, e.Value, codeShutdown, true)
		}
	}
}

func (t *Table) newRoom() *room {
	if n := len(t.freeRooms); n > 0 {
		r := t.freeRooms[n-1]
		t.freeRooms = t.freeRooms[:n-1]
		return r
	}
	r := &room{}
	r.entry.Value = r
	return r
}

// maxFree bounds the room and tombstone pools.
const maxFree = 4096

func (t *Table) freeRoom(r *room) {
	*r = room{}
	if len(t.freeRooms) < maxFree {
		r.entry.Value = r
		t.freeRooms = append(t.freeRooms, r)
	}
}

// linkPeer adds a live room bound to a peer to that peer's list.
func (t *Table) linkPeer(r *room) {
	if r.peer == NoPeer || r.state.Terminal() {
		return
	}
	head := t.peers[r.peer]
	r.peerPrev, r.peerNext = nil, head
	if head != nil {
		head.peerPrev = r
	}
	t.peers[r.peer] = r
}

// unlinkPeer removes r from its peer's list if it is there.
func (t *Table) unlinkPeer(r *room) {
	if r.peer == NoPeer {
		return
	}
	if r.peerPrev != nil {
		r.peerPrev.peerNext = r.peerNext
	} else if t.peers[r.peer] == r {
		if r.peerNext != nil {
			t.peers[r.peer] = r.peerNext
		} else {
			delete(t.peers, r.peer)
		}
	} else {
		return // not linked
	}
	if r.peerNext != nil {
		r.peerNext.peerPrev = r.peerPrev
	}
	r.peerPrev, r.peerNext = nil, nil
}
