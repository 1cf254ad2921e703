package room

import (
	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// roomReason is the one mapping from the data plane's failure reasons to room reasons, for
// the daemon of side. It is a switch, not a cast: the two sets are separate vocabularies,
// and a transfer reason that is not a room reason would be refused by Step, leaving the
// room to wait out its idle deadline. TestEveryTransferReasonHasARoomReason runs it over
// transfer.AllReasons on both sides, and TestTransferReasonsMapAsTheGoldenTable pins it.
//
// fails is false where the peer owns the room's reason and its control plane brings it
// (ABORT, retried until acknowledged; the transfer-idle deadline covers a notice that
// never comes); failing the room here would record the wrong one:
//   - ReasonFenced, either side: decode stopped taking the room's bytes because it ended
//     the room.
//   - ReasonRegionReplaced on decode: decode found prefill's region file replaced (the
//     same-host path's per-chunk stat) and told prefill in the RESULT, so prefill fails its
//     room region_replaced, as when prefill notices the replacement itself, and decode's
//     room ends aborted:remote naming region_replaced: one event, the reasons of TCP's.
//
// known is false for a reason this build has no mapping for; the room then fails with
// transfer_error rather than hang, and the test above fails.
func roomReason(side poll.Side, r transfer.Reason) (reason poll.Reason, fails, known bool) {
	switch r {
	case transfer.ReasonChecksum:
		return poll.ReasonChecksum, true, true
	case transfer.ReasonTransferError:
		return poll.ReasonTransferError, true, true
	case transfer.ReasonInvalid:
		return poll.ReasonInvalid, true, true
	case transfer.ReasonFenced:
		return poll.ReasonNone, false, true
	case transfer.ReasonRegionReplaced:
		if side == poll.Decode {
			return poll.ReasonNone, false, true
		}
		return poll.ReasonRegionReplaced, true, true
	}
	return poll.ReasonTransferError, true, false
}

// roomFailure is roomReason for the daemon's callbacks: the reason to fail the room with, and
// whether to fail it here at all. A reason with no mapping is logged as the bug it is.
func roomFailure(log *zap.Logger, side poll.Side, r transfer.Reason) (poll.Reason, bool) {
	reason, fails, known := roomReason(side, r)
	if !known {
		log.Error("transfer reason has no room reason", zap.String("transfer_reason", string(r)), zap.String("reason", string(reason)))
	}
	return reason, fails
}
