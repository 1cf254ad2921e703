package poll

// Reason says why a room failed or was removed. It is a closed set so
// metrics can label by it; ParseReason maps wire strings onto it.
type Reason string

// Failure reasons.
const (
	ReasonNone                   Reason = ""
	ReasonTimeoutBootstrapping   Reason = "timeout:bootstrapping"
	ReasonTimeoutWaitingForInput Reason = "timeout:waiting_for_input"
	ReasonTimeoutTransferring    Reason = "timeout:transferring"
	ReasonAbortedLocal           Reason = "aborted:local"
	ReasonAbortedRemote          Reason = "aborted:remote"
	ReasonPeerLost               Reason = "peer_lost"
	ReasonPeerRestarted          Reason = "peer_restarted"
	ReasonCollision              Reason = "collision"
	ReasonTransferError          Reason = "transfer_error"
	ReasonChecksum               Reason = "checksum"
	ReasonShutdown               Reason = "shutdown"
	ReasonInvalid                Reason = "invalid"
	// ReasonRegionReplaced: the engine replaced or unregistered the
	// region file the room's pages live in (an engine restart); its bytes
	// would be in a dead inode.
	ReasonRegionReplaced Reason = "region_replaced"
	// ReasonUncleared is a removal reason, not a failure reason: a terminal
	// room the scheduler never cleared was reaped (I7).
	ReasonUncleared Reason = "uncleared"
)

// reasonCode is the compact form stored in rooms, history and counters.
type reasonCode uint8

const numReasonCodes = 15

var reasonByCode = [numReasonCodes]Reason{
	ReasonNone,
	ReasonTimeoutBootstrapping, ReasonTimeoutWaitingForInput, ReasonTimeoutTransferring,
	ReasonAbortedLocal, ReasonAbortedRemote, ReasonPeerLost, ReasonPeerRestarted,
	ReasonCollision, ReasonTransferError, ReasonChecksum, ReasonShutdown, ReasonInvalid,
	ReasonRegionReplaced, ReasonUncleared,
}

const (
	codeNone      reasonCode = 0
	codeUncleared reasonCode = numReasonCodes - 1
)

// AllReasons returns every failure reason, in a stable order, for metrics
// (ReasonNone and the removal reason ReasonUncleared excluded).
func AllReasons() []Reason {
	out := make([]Reason, 0, numReasonCodes-2)
	return append(out, reasonByCode[1:numReasonCodes-1]...)
}

// ParseReason maps a string (for example from a peer's frame) onto the
// closed set; ok is false for anything that is not a failure reason.
func ParseReason(s string) (Reason, bool) {
	c, ok := codeOf(Reason(s))
	if !ok || c == codeNone || c == codeUncleared {
		return ReasonInvalid, false
	}
	return reasonByCode[c], true
}

func codeOf(r Reason) (reasonCode, bool) {
	for i, x := range reasonByCode {
		if x == r {
			return reasonCode(i), true
		}
	}
	return 0, false
}

func (c reasonCode) reason() Reason { return reasonByCode[c] }

// timeoutReason returns timeout:<state> for a non-terminal state.
func timeoutReason(s State) reasonCode {
	switch s {
	case Bootstrapping:
		return 1
	case WaitingForInput:
		return 2
	default:
		return 3
	}
}

var (
	codeAbortedLocal  = mustCode(ReasonAbortedLocal)
	codeAbortedRemote = mustCode(ReasonAbortedRemote)
	codePeerLost      = mustCode(ReasonPeerLost)
	codePeerRestarted = mustCode(ReasonPeerRestarted)
	codeShutdown      = mustCode(ReasonShutdown)
	codeCollision     = mustCode(ReasonCollision)
)

func mustCode(r Reason) reasonCode {
	c, ok := codeOf(r)
	if !ok {
		panic("poll: unknown reason " + string(r))
	}
	return c
}
