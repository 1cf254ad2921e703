package poll

import (
	"errors"
	"fmt"
)

// Sentinel errors returned by Step and the read side. The driver maps them
// to gRPC codes at the service edge.
var (
	// ErrNotFound: no room with this id is in the table and none ended recently.
	ErrNotFound = errors.New("poll: room not found")
	// ErrRoomEnded: the room was cleared or reaped recently (an ended tombstone answered); errors.Is(ErrRoomEnded, ErrNotFound) holds.
	ErrRoomEnded = fmt.Errorf("poll: room ended: %w", ErrNotFound)
	// ErrAlreadyExists: Open of a key whose room is already in the table.
	ErrAlreadyExists = errors.New("poll: room already exists")
	// ErrCollision: Open of a room id held by a room with another nonce (R5).
	ErrCollision = errors.New("poll: room id collision")
	// ErrNonceMismatch: the event's nonce is not the room's; it belongs to another request.
	ErrNonceMismatch = errors.New("poll: nonce mismatch")
	// ErrPeerMismatch: a frame about the room came from a peer it is not bound to.
	ErrPeerMismatch = errors.New("poll: peer mismatch")
	// ErrIllegalTransition: the move table has no move for this event in the room's state.
	ErrIllegalTransition = errors.New("poll: illegal transition")
	// ErrTerminal: the room is Success or Failed; terminal states are sticky (I1).
	ErrTerminal = errors.New("poll: room is terminal")
	// ErrNotTerminal: Clear of a room the scheduler cannot yet see as terminal.
	ErrNotTerminal = errors.New("poll: room is not terminal")
	// ErrInvalidEvent: the event or argument is malformed (unknown kind, missing nonce, bad rank, bad reason, bad page token).
	ErrInvalidEvent = errors.New("poll: invalid event")
	// ErrResourceExhausted: Open beyond Config.MaxRooms.
	ErrResourceExhausted = errors.New("poll: too many rooms")
	// ErrUnknownState: ParseState got a name that is not a room state.
	ErrUnknownState = errors.New("poll: unknown state")
)
