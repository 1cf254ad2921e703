package room

import (
	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// roomReason is the one mapping from the data plane's failure reasons to room reasons. It is
// a switch, not a cast: the two sets are separate vocabularies, and a transfer reason that
// is not a room reason would be refused by Step, leaving the room to wait out its idle
// deadline. TestEveryTransferReasonHasARoomReason runs it over transfer.AllReasons.
//
// fails is false for ReasonFenced: decode stopped taking the room's bytes because it ended
// the room, and its control plane brings the room's real reason (ABORT, retried until
// acknowledged); failing the room here would record the wrong one. known is false for a
// reason this build has no mapping for; the room then fails with transfer_error rather than
// hang, and the test above fails.
func roomReason(r transfer.Reason) (reason poll.Reason, fails, known bool) {
	switch r {
	case transfer.ReasonChecksum:
		return poll.ReasonChecksum, true, true
	case transfer.ReasonTransferError:
		return poll.ReasonTransferError, true, true
	case transfer.ReasonInvalid:
		return poll.ReasonInvalid, true, true
	case transfer.ReasonFenced:
		return poll.ReasonNone, false, true
	}
	return poll.ReasonTransferError, true, false
}

// roomFailure is roomReason for the daemon's callbacks: the reason to fail the room with, and
// whether to fail it here at all. A reason with no mapping is logged as the bug it is.
func roomFailure(log *zap.Logger, r transfer.Reason) (poll.Reason, bool) {
	reason, fails, known := roomReason(r)
	if !known {
		log.Error("transfer reason has no room reason", zap.String("transfer_reason", string(r)), zap.String("reason", string(reason)))
	}
	return reason, fails
}
