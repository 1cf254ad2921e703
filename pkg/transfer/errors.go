package transfer

import (
	"errors"
	"fmt"
)

// Layout and region errors.
var (
	// ErrInvalidLayout means a Layout is malformed (zero page size, overlapping buffers, ...).
	ErrInvalidLayout = errors.New("transfer: invalid layout")
	// ErrIncompatibleLayout means the two sides' layouts cannot exchange pages
	// (buffer count, page size or aux row size differ).
	ErrIncompatibleLayout = errors.New("transfer: incompatible layouts")
	// ErrOpaqueTP means two layouts of different TP sizes cannot map because one of them
	// does not describe its heads (attention and the buffers' head fields).
	ErrOpaqueTP = errors.New("transfer: opaque layouts need equal tp sizes")
	// ErrRegionTooSmall means the region file is shorter than its layout needs.
	ErrRegionTooSmall = errors.New("transfer: region file smaller than layout")
	// ErrRegionReplaced means the file at a region's path is no longer the mapped one.
	ErrRegionReplaced = errors.New("transfer: region file replaced")
	// ErrRegionClosed means the region was unmapped.
	ErrRegionClosed = errors.New("transfer: region closed")
	// ErrRegionFault means region memory faulted while pages were copied (its file was
	// truncated under the mapping); the rooms being copied fail with transfer_error.
	ErrRegionFault = errors.New("transfer: region memory fault")
)

// Page list errors.
var (
	// ErrPageOutOfRange means a run names a page outside its buffer.
	ErrPageOutOfRange = errors.New("transfer: page out of range")
	// ErrRunsOverlap means a page appears twice in one page list (repeats are refused).
	ErrRunsOverlap = errors.New("transfer: page repeated in page list")
	// ErrEmptyRun means a run has a count below one or a negative start.
	ErrEmptyRun = errors.New("transfer: run with non-positive count or negative start")
	// ErrRunsMismatch means source and destination page lists differ in page count, or the
	// number of per-buffer page lists differs from the layout's buffer count.
	ErrRunsMismatch = errors.New("transfer: source and destination page lists do not match")
	// ErrSliceMismatch means a chunk's head slice is not one its room expects, or a room of
	// head slices got whole pages (or the other way round).
	ErrSliceMismatch = errors.New("transfer: head slice not expected by the room")
	// ErrAuxMismatch means an aux row is missing, the wrong length or out of range.
	ErrAuxMismatch = errors.New("transfer: aux row mismatch")
)

// Wire errors, returned by the frame decoders. A decoder never panics.
var (
	// ErrShortFrame means fewer bytes than a header or run list needs.
	ErrShortFrame = errors.New("transfer: short frame")
	// ErrBadMagic means the frame does not start with the pdlink data magic.
	ErrBadMagic = errors.New("transfer: bad frame magic")
	// ErrBadVersion means the frame has a wire version this build does not speak.
	ErrBadVersion = errors.New("transfer: unsupported frame version")
	// ErrHeaderChecksum means the header's own crc32c does not match: the header is
	// corrupt and none of its fields (room, pages, lengths) may be trusted.
	ErrHeaderChecksum = errors.New("transfer: header checksum mismatch")
	// ErrBadFrameType means an unknown frame type or flags.
	ErrBadFrameType = errors.New("transfer: bad frame type")
	// ErrFrameTooLarge means a length field exceeds the protocol limits.
	ErrFrameTooLarge = errors.New("transfer: frame too large")
	// ErrRunsChecksum means the run list does not match the crc32c in its header.
	ErrRunsChecksum = errors.New("transfer: run list checksum mismatch")
	// ErrBadSlice means a head slice names no heads, or heads outside its row or page.
	ErrBadSlice = errors.New("transfer: head slice outside its row")
)

// Transfer errors.
var (
	// ErrChecksum means a payload did not match its crc32c (reason "checksum").
	ErrChecksum = errors.New("transfer: payload checksum mismatch")
	// ErrConnBroken means the data connection carrying the room failed (reason "transfer_error").
	ErrConnBroken = errors.New("transfer: data connection broken")
	// ErrRejected means the receiver refused the room's frames (reason "invalid"); a
	// RESULT that refused the room (ResultError: invalid or fenced) matches it too.
	ErrRejected = errors.New("transfer: receiver rejected the room")
	// ErrNoRankRegion means a stream or expectation named a rank the daemon holds no region for.
	ErrNoRankRegion = errors.New("transfer: no region for the key's rank")
	// ErrUnknownPeer means Send named a peer that was not added with AddPeer.
	ErrUnknownPeer = errors.New("transfer: unknown peer")
	// ErrFenced means Send was waiting for admission when its room was fenced; nothing was charged.
	ErrFenced = errors.New("transfer: room fenced")
	// ErrStreamEnded means Append named a stream that is not open, or that already took its
	// last piece or failed (its Done says why).
	ErrStreamEnded = errors.New("transfer: stream not open or ended")
	// ErrDuplicateRoom means a live room with the same key, rank included, is already registered.
	ErrDuplicateRoom = errors.New("transfer: room already registered")
	// ErrClosed means the sender or receiver was closed.
	ErrClosed = errors.New("transfer: closed")
	// ErrBadConfig means a configuration value is out of range.
	ErrBadConfig = errors.New("transfer: bad config")
	// ErrUnknownKind means a data transport Kind this build does not have.
	ErrUnknownKind = errors.New("transfer: unknown data transport")
	// ErrAuth means the connection preface (Authenticator) failed.
	ErrAuth = errors.New("transfer: connection authentication failed")
)

// Same-host transport (shm*.go).
var (
	// ErrShmRefused: decode could not prove the prefill region file (--data-transport=shm refuses TCP).
	ErrShmRefused = errors.New("transfer: same-host pages refused by the peer")
	// ErrBadShmOffer: a SHM_OFFER payload that does not parse.
	ErrBadShmOffer = errors.New("transfer: malformed shm offer")
	// ErrShmSource: a shm chunk names an offer or source pages the connection has not proven.
	ErrShmSource = errors.New("transfer: shm chunk source not proven on this connection")
)

// ResultError is a room's failure as the receiver's RESULT frame named it: Code is the
// wire reason code, Reason its name. Its message says what decode did: fenced (decode
// ended the room, or does not expect this stream) or rejected as invalid; a checksum,
// transfer_error or region_replaced result wraps that reason's sentinel (ErrChecksum,
// ErrConnBroken, ErrRegionReplaced), and fenced or invalid match ErrRejected.
type ResultError struct {
	Code   uint32
	Reason Reason
}

func (e *ResultError) Error() string {
	switch e.Reason {
	case ReasonFenced:
		return fmt.Sprintf("transfer: receiver fenced the room (result code %d): decode ended it (abort, timeout, "+
			"shutdown) or does not expect this stream", e.Code)
	case ReasonInvalid:
		return fmt.Sprintf("transfer: receiver rejected the room's frames as invalid (result code %d)", e.Code)
	}
	return fmt.Sprintf("%v (reported by receiver, result code %d)", e.sentinel(), e.Code)
}

// sentinel is the package error the result stands for.
func (e *ResultError) sentinel() error {
	switch e.Reason {
	case ReasonChecksum:
		return ErrChecksum
	case ReasonTransferError:
		return ErrConnBroken
	case ReasonRegionReplaced:
		return ErrRegionReplaced
	}
	return ErrRejected
}

func (e *ResultError) Unwrap() error { return e.sentinel() }
