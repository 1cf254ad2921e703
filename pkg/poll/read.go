package poll

import (
	"slices"
	"strconv"
	"time"
)

// Poll reports, for each room id, the state the scheduler may see (I9), or
// StateNone if no room with that id is in the table. The result is
// appended to out[:0]; pass a slice with enough capacity and Poll does not
// allocate. It does not advance time: the driver's Tick does.
func (t *Table) Poll(rooms []RoomID, out []State) []State {
	out = out[:0]
	for _, id := range rooms {
		if r := t.rooms[id]; r != nil {
			out = append(out, r.visible)
		} else {
			out = append(out, StateNone)
		}
	}
	return out
}

// Status is what the scheduler may see of one room (see PollStatus).
type Status struct {
	// State is the visible state (I9); StateNone: no room with this id.
	State State
	// Nonce is the room's nonce in every state (0 only for an unbound
	// prefill room or StateNone).
	Nonce Nonce
	// Reason and PeerReason are set once Failed is visible.
	Reason     Reason
	PeerReason Reason
}

// PollStatus is Poll with each room's nonce and, once Failed is visible,
// its reasons: one pass over the table, no allocation when out has the
// capacity.
func (t *Table) PollStatus(rooms []RoomID, out []Status) []Status {
	out = out[:0]
	for _, id := range rooms {
		r := t.rooms[id]
		if r == nil {
			out = append(out, Status{})
			continue
		}
		st := Status{State: r.visible, Nonce: r.key.Nonce}
		if r.visible == Failed {
			st.Reason, st.PeerReason = r.reason.reason(), r.peerReason.reason()
		}
		out = append(out, st)
	}
	return out
}

// HistoryEntry is one transition of a room.
type HistoryEntry struct {
	At     int64
	From   State
	To     State
	Reason Reason
}

// RoomInfo is a copy of a room's state for GetRoom/ListRooms.
type RoomInfo struct {
	Key     Key
	Peer    PeerID
	State   State // internal state
	Visible State // what Poll reports
	Fenced  bool
	Reason  Reason // failure reason (Failed only)
	// PeerReason is the reason the peer gave when it failed the room.
	PeerReason     Reason
	Ranks          int    // expected ranks
	RanksDone      uint64 // bitmask of ranks done
	CreatedAt      int64
	StateEnteredAt int64
	// Deadline: when the room fails (live) or is reaped (terminal).
	Deadline int64
	History  []HistoryEntry
	// HistoryDropped counts the oldest entries dropped from the ring.
	HistoryDropped int
}

// Get returns a copy of the room with this id.
func (t *Table) Get(id RoomID) (RoomInfo, error) {
	r := t.rooms[id]
	if r == nil {
		if tb := t.findEnded(Key{Room: id}, false); tb != nil {
			return RoomInfo{}, ErrRoomEnded
		}
		return RoomInfo{}, ErrNotFound
	}
	return t.info(r), nil
}

func (t *Table) info(r *room) RoomInfo {
	in := RoomInfo{
		Key: r.key, Peer: r.peer, State: r.state, Visible: r.visible, Fenced: r.fenced,
		Reason: r.reason.reason(), PeerReason: r.peerReason.reason(),
		Ranks: r.expectedRanks(), RanksDone: r.ranksDone,
		CreatedAt: r.createdAt, StateEnteredAt: r.enteredAt, Deadline: t.q.Deadline(&r.entry),
		History:        make([]HistoryEntry, r.histN),
		HistoryDropped: int(r.histDropped),
	}
	for i := range in.History {
		h := r.hist[(int(r.histStart)+i)%t.cfg.HistoryLen]
		in.History[i] = HistoryEntry{At: h.at, From: h.from, To: h.to, Reason: h.reason.reason()}
	}
	return in
}

// Filter selects rooms for List. Zero fields match everything.
type Filter struct {
	State  State         // internal state; StateNone: any
	MinAge time.Duration // room age (since Open) at least this
	Peer   PeerID        // NoPeer: any
}

// List returns up to limit rooms matching f in room id order, starting
// after pageToken ("" for the first page), and the token of the next page
// ("" when done). It is O(n log n) over the table: a debug and operator
// path, not for the scheduler's hot loop.
func (t *Table) List(now int64, f Filter, pageToken string, limit int) ([]RoomInfo, string, error) {
	var after uint64
	hasAfter := pageToken != ""
	if hasAfter {
		v, err := strconv.ParseUint(pageToken, 10, 64)
		if err != nil {
			return nil, "", ErrInvalidEvent
		}
		after = v
	}
	if limit <= 0 {
		limit = 100
	}
	if now < t.now {
		now = t.now
	}
	var ids []RoomID
	for id, r := range t.rooms {
		if hasAfter && uint64(id) <= after {
			continue
		}
		if f.State != StateNone && r.state != f.State ||
			f.Peer != NoPeer && r.peer != f.Peer ||
			time.Duration(now-r.createdAt) < f.MinAge {
			continue
		}
		ids = append(ids, id)
	}
	slices.Sort(ids)
	next := ""
	if len(ids) > limit {
		ids = ids[:limit]
		next = strconv.FormatUint(uint64(ids[limit-1]), 10)
	}
	out := make([]RoomInfo, len(ids))
	for i, id := range ids {
		out[i] = t.info(t.rooms[id])
	}
	return out, next, nil
}

// ClearBatch clears each room id (EvClear) and stores the per-room result
// in errs (which must be at least as long as rooms).
func (t *Table) ClearBatch(now int64, rooms []RoomID, errs []error) {
	for i, id := range rooms {
		errs[i] = t.Step(now, Event{Kind: EvClear, Key: Key{Room: id}})
	}
}
