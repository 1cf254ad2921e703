package room

import (
	"errors"
	"fmt"

	"github.com/pdlink/pdlink/pkg/poll"
)

var (
	// ErrNoRegion means the call needs a registered region and none is.
	ErrNoRegion = errors.New("no region registered: call RegisterRegion first")
	// ErrUnsupported means the request needs what this build does not do yet (fan-out).
	ErrUnsupported = errors.New("room: not supported yet")
	// ErrNotSendable means the room takes no Send in its state now; the message names it.
	ErrNotSendable = errors.New("room: takes no send now")
	// ErrTransferRefused means the data plane refused a Send's pages.
	ErrTransferRefused = errors.New("room: transfer refused")
	// ErrMetadataConflict means the room already has metadata that differs from a SendMetadata's.
	ErrMetadataConflict = errors.New("room: other metadata already sent")
	// ErrRankMapping means a decode peer's rank mapping cannot be served (yet), or names a rank with no region.
	ErrRankMapping = errors.New("room: rank mapping not served")
	// ErrDataPlane means the data plane could not be started for a region.
	ErrDataPlane = errors.New("room: cannot start data plane")
	// ErrRegionPathRefused means a region path is no file a region may be (pkg/regionpath's rules).
	ErrRegionPathRefused = errors.New("room: region path refused")
)

// FieldError is a request field the room refused: the edge answers it as
// InvalidArgument naming Field.
type FieldError struct{ Field, Desc string }

func (e *FieldError) Error() string { return e.Field + ": " + e.Desc }

// invalid is a FieldError with a formatted description.
func invalid(field, format string, args ...any) error {
	return &FieldError{Field: field, Desc: fmt.Sprintf(format, args...)}
}

// EndedError says the call needs a live room and the room is Failed: the
// edge names its visible state, and the reasons once Failed is visible (I9).
type EndedError struct{ Info poll.RoomInfo }

func (e *EndedError) Error() string {
	return fmt.Sprintf("room %d is %v and ending", e.Info.Key.Room, e.Info.Visible)
}

// kindError is a sentinel (kind) with its own message: errors.Is finds
// the kind, the edge shows the message.
type kindError struct {
	kind error
	msg  string
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

func errorf(kind error, format string, args ...any) error {
	return &kindError{kind: kind, msg: fmt.Sprintf(format, args...)}
}
