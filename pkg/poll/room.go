package poll

import "github.com/pdlink/pdlink/pkg/inflight"

// room is one request's transfer on this side. Rooms are pooled by the
// table; nothing outside the owner holds a pointer to one.
type room struct {
	key   Key
	peer  PeerID
	state State
	// visible is what Poll reports: equal to state, except that a Failed
	// room shows its previous state until the driver fenced it (I9).
	visible    State
	fenced     bool
	reason     reasonCode
	peerReason reasonCode
	ranks      uint8 // expected ranks; 0 = unset, means 1
	// addressed is how many METADATA frames a prefill room waits for in
	// Bootstrapping (0: the first); ranksDone holds the ones seen until
	// then, and the ranks done after.
	addressed uint8
	ranksDone uint64
	createdAt int64
	enteredAt int64 // when the room entered its current state

	entry              inflight.Entry[*room]
	peerPrev, peerNext *room // intrusive list of live rooms bound to peer

	hist        [HistoryCap]histEntry
	histStart   uint8
	histN       uint8
	histDropped uint32
}

// histEntry is one transition in the room's history ring (16 bytes).
type histEntry struct {
	at       int64
	from, to State
	reason   reasonCode
}

// record appends a transition to the ring, dropping the oldest when full.
func (r *room) record(limit int, at int64, from, to State, reason reasonCode) {
	e := histEntry{at: at, from: from, to: to, reason: reason}
	if int(r.histN) < limit {
		r.hist[(int(r.histStart)+int(r.histN))%limit] = e
		r.histN++
		return
	}
	r.hist[r.histStart] = e
	r.histStart = uint8((int(r.histStart) + 1) % limit)
	r.histDropped++
}

// expectedRanks returns how many distinct ranks must be Done.
func (r *room) expectedRanks() int {
	if r.ranks == 0 {
		return 1
	}
	return int(r.ranks)
}

// allRanksDone reports whether every expected rank reported Done.
func (r *room) allRanksDone() bool { return r.ranksDone == maskOf(r.expectedRanks()) }

// maskOf is the bitmask of ranks 0..n-1.
func maskOf(n int) uint64 {
	if n >= 64 {
		return ^uint64(0)
	}
	return (uint64(1) << n) - 1
}

// classOf maps a state to its inflight class. The mapping is a lookup, not
// arithmetic on state numbers.
var classOf = [numStates]inflight.Class{
	Bootstrapping:   0,
	WaitingForInput: 1,
	Transferring:    2,
	Success:         3,
	Failed:          4,
}

// stateOfClass is the inverse of classOf.
var stateOfClass = [...]State{Bootstrapping, WaitingForInput, Transferring, Success, Failed}
