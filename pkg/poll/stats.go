package poll

import "time"

// RejectReason says why an event was rejected (frames_rejected_total).
type RejectReason uint8

// Reject reasons.
const (
	_ RejectReason = iota // zero is no reason
	// RejectIllegal: the move table has no such move.
	RejectIllegal
	// RejectTerminal: the room is terminal (I1).
	RejectTerminal
	// RejectNonceMismatch: the event belongs to another request.
	RejectNonceMismatch
	// RejectPeerMismatch: the frame came from a peer the room is not bound to.
	RejectPeerMismatch
	// RejectUnknownRoom: no such room, never seen (I3).
	RejectUnknownRoom
	// RejectEndedRoom: the room ended recently (R2, R3).
	RejectEndedRoom
	// RejectAlreadyExists: Open of an existing key.
	RejectAlreadyExists
	// RejectCollision: Open of a room id held by another nonce (R5).
	RejectCollision
	// RejectNotTerminal: Clear of a room the scheduler cannot see as terminal.
	RejectNotTerminal
	// RejectInvalid: malformed event.
	RejectInvalid
	// RejectExhausted: MaxRooms reached.
	RejectExhausted

	numRejects = iota
)

// Short internal names used by the code.
const (
	rejIllegal       = RejectIllegal
	rejTerminal      = RejectTerminal
	rejNonce         = RejectNonceMismatch
	rejPeer          = RejectPeerMismatch
	rejUnknown       = RejectUnknownRoom
	rejEnded         = RejectEndedRoom
	rejAlreadyExists = RejectAlreadyExists
	rejCollision     = RejectCollision
	rejNotTerminal   = RejectNotTerminal
	rejInvalid       = RejectInvalid
	rejExhausted     = RejectExhausted
)

var rejectNames = [numRejects]string{"none", "illegal_transition", "terminal", "nonce_mismatch", "peer_mismatch",
	"unknown_room", "ended_room", "already_exists", "collision", "not_terminal", "invalid", "resource_exhausted"}

func (r RejectReason) String() string {
	if int(r) < numRejects {
		return rejectNames[r]
	}
	return "unknown"
}

// AllRejectReasons returns every reject reason, for metrics.
func AllRejectReasons() []RejectReason {
	out := make([]RejectReason, 0, numRejects-1)
	for r := RejectReason(1); r < numRejects; r++ {
		out = append(out, r)
	}
	return out
}

func (t *Table) reject(r RejectReason) { t.ctr.rejected[r]++ }

// counters are monotonic totals since the table was created.
type counters struct {
	transitions  [numStates][numStates]uint64
	failures     [numReasonCodes]uint64
	rejected     [numRejects]uint64
	collisions   uint64
	reaped       uint64
	abortTombs   uint64
	rebound      uint64
	tombsEvicted uint64
	tombsExpired uint64
}

// Stats is a snapshot of the table for metrics. It is a value: arrays, no
// maps, no allocation.
type Stats struct {
	// Inflight is the number of live (non-terminal) rooms.
	Inflight int
	// Rooms is every room in the table, terminal ones included.
	Rooms int
	// Tombstones counts abort and ended tombstones.
	Tombstones int
	// Collisions counts room id collisions seen here: opens refused
	// because another nonce holds the id, peer frames about a held id with
	// another nonce (detected: the sender is told collision), and rooms
	// that failed because the peer said collision (told).
	Collisions uint64
	// ReapedUncleared, AbortTombstones, TombstonesEvicted and
	// TombstonesExpired are totals.
	ReapedUncleared   uint64
	AbortTombstones   uint64
	TombstonesEvicted uint64
	TombstonesExpired uint64
	// Rebound counts rooms moved to a restarted peer's new instance
	// (EvPeerReplaced) instead of failing.
	Rebound uint64

	count     [numStates]int
	oldest    [numStates]time.Duration
	overdue   [numStates]int
	deadline  [numStates]time.Duration
	ctr       counters
	rejectSum uint64
}

// Count returns the number of rooms in state s.
func (s Stats) Count(st State) int { return s.count[st] }

// OldestAge returns the age of the oldest room in state st, measured from
// when it entered st (for Transferring: from its last progress, the idle
// age its deadline counts).
func (s Stats) OldestAge(st State) time.Duration { return s.oldest[st] }

// Overdue returns how many rooms of state st passed OverdueFraction of
// their deadline.
func (s Stats) Overdue(st State) int { return s.overdue[st] }

// Deadline returns the deadline of state st (the clear linger for terminal
// states), so alerts can compare OldestAge with it.
func (s Stats) Deadline(st State) time.Duration { return s.deadline[st] }

// Transitions returns how many rooms moved from -> to (from StateNone:
// opened).
func (s Stats) Transitions(from, to State) uint64 { return s.ctr.transitions[from][to] }

// Failures returns how many rooms failed with reason r.
func (s Stats) Failures(r Reason) uint64 {
	c, _ := codeOf(r)
	return s.ctr.failures[c]
}

// Rejected returns how many events were rejected with reason r.
func (s Stats) Rejected(r RejectReason) uint64 { return s.ctr.rejected[r] }

// RejectedTotal returns all rejections.
func (s Stats) RejectedTotal() uint64 { return s.rejectSum }

// Stats returns a snapshot; ages are measured at now (clamped to the
// table's time). It produces no effects and expires nothing, so a metrics
// scrape may call it without draining Ready: overdue counts and expiry are
// as of the last Step or Tick, and OldestAge past Deadline means the driver
// stopped ticking. O(states) plus amortised O(1) per newly overdue room.
func (t *Table) Stats(now int64) Stats {
	now = max(now, t.now)
	t.q.AdvanceOverdue(t.now)
	s := Stats{
		Rooms:             len(t.rooms),
		Tombstones:        t.tq.Len(),
		Collisions:        t.ctr.collisions,
		ReapedUncleared:   t.ctr.reaped,
		AbortTombstones:   t.ctr.abortTombs,
		TombstonesEvicted: t.ctr.tombsEvicted,
		TombstonesExpired: t.ctr.tombsExpired,
		Rebound:           t.ctr.rebound,
		ctr:               t.ctr,
	}
	for _, st := range stateOfClass {
		cl := classOf[st]
		s.count[st] = t.q.Count(cl)
		s.oldest[st] = t.q.OldestAge(cl, now)
		s.overdue[st] = t.q.Overdue(cl)
		s.deadline[st] = t.q.DeadlineOf(cl)
		if !st.Terminal() {
			s.Inflight += s.count[st]
		}
	}
	for _, n := range t.ctr.rejected {
		s.rejectSum += n
	}
	return s
}
