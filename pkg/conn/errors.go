package conn

import "errors"

// Sentinel errors. Frame errors map onto a RejectReason (RejectReasonOf);
// node errors wrap poll's sentinels where the room table decided.
var (
	// ErrFrameTooLarge: the frame is over the receiver's size limit.
	ErrFrameTooLarge = errors.New("conn: frame too large")
	// ErrDecode: the frame is not a protobuf Envelope.
	ErrDecode = errors.New("conn: frame does not decode")
	// ErrVersion: the envelope's protocol version is not one we speak.
	ErrVersion = errors.New("conn: unsupported protocol version")
	// ErrInvalidFrame: the envelope or its body breaks a validity rule.
	ErrInvalidFrame = errors.New("conn: invalid frame")
	// ErrTooMany: a list in the frame (pages, runs, layouts, buffers) is over its limit.
	ErrTooMany = errors.New("conn: too many elements in frame")
	// ErrAuth: the envelope's MAC did not verify.
	ErrAuth = errors.New("conn: frame authentication failed")
	// ErrUnknownPeer: a frame other than REGISTER came from a peer that has not registered.
	ErrUnknownPeer = errors.New("conn: unknown peer")
	// ErrForeignRoom: the frame names a room bound to another peer or request.
	ErrForeignRoom = errors.New("conn: room belongs to another peer")
	// ErrStaleEpoch: the frame comes from an older incarnation of a known peer.
	ErrStaleEpoch = errors.New("conn: stale peer epoch")
	// ErrTooManyPeers: REGISTER beyond Config.MaxPeers.
	ErrTooManyPeers = errors.New("conn: too many peers")
	// ErrNotBootstrapping: SendMetadata for a room that is not in Bootstrapping.
	ErrNotBootstrapping = errors.New("conn: room is not bootstrapping")
	// ErrClosedNode: the node is closed or not started.
	ErrClosedNode = errors.New("conn: node closed")
	// ErrBadArgument: a caller passed an invalid argument (empty address, zero room...).
	ErrBadArgument = errors.New("conn: bad argument")
)

// RejectReason says why an incoming frame was rejected
// (pdlink_frames_rejected_total{reason}).
type RejectReason uint8

// Reject reasons.
const (
	RejectDecode RejectReason = iota
	RejectVersion
	RejectInvalid
	RejectTooLarge
	RejectAuth
	RejectDuplicate
	RejectUnknownPeer
	RejectForeignRoom
	RejectStaleEpoch
	RejectTooManyPeers
	// RejectOwnerBusy: a room frame arrived with Config.MaxUnansweredFrames
	// already waiting for the room owner; it is dropped unanswered and the
	// peer retransmits it.
	RejectOwnerBusy
	numRejectReasons
)

var rejectNames = [numRejectReasons]string{
	"decode", "version", "invalid", "too_large", "auth", "duplicate",
	"unknown_peer", "foreign_room", "stale_epoch", "too_many_peers", "owner_busy",
}

func (r RejectReason) String() string {
	if r < numRejectReasons {
		return rejectNames[r]
	}
	return "unknown"
}

// AllRejectReasons returns every reject reason, for metrics.
func AllRejectReasons() []RejectReason {
	out := make([]RejectReason, numRejectReasons)
	for i := range out {
		out[i] = RejectReason(i)
	}
	return out
}

// RejectReasonOf maps a frame error onto its reject reason; ok is false for
// errors that are not frame rejections.
func RejectReasonOf(err error) (RejectReason, bool) {
	switch {
	case errors.Is(err, ErrFrameTooLarge), errors.Is(err, ErrTooMany):
		return RejectTooLarge, true
	case errors.Is(err, ErrDecode):
		return RejectDecode, true
	case errors.Is(err, ErrVersion):
		return RejectVersion, true
	case errors.Is(err, ErrInvalidFrame):
		return RejectInvalid, true
	case errors.Is(err, ErrAuth):
		return RejectAuth, true
	case errors.Is(err, ErrUnknownPeer):
		return RejectUnknownPeer, true
	case errors.Is(err, ErrForeignRoom):
		return RejectForeignRoom, true
	case errors.Is(err, ErrStaleEpoch):
		return RejectStaleEpoch, true
	case errors.Is(err, ErrTooManyPeers):
		return RejectTooManyPeers, true
	}
	return 0, false
}
