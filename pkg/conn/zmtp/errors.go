package zmtp

import "errors"

// ErrBadAddress is returned by Listen and Dial for an address that is not
// "tcp://host:port".
var ErrBadAddress = errors.New("zmtp: address must be tcp://host:port")

// ErrFrameTooLarge is returned by Send for a frame over conn.MaxFrameSize.
var ErrFrameTooLarge = errors.New("zmtp: frame larger than conn.MaxFrameSize")

// ErrRejected is matched (errors.Is) by every error the guard returns when it
// closes a connection for a protocol violation.
var ErrRejected = errors.New("zmtp: peer rejected by guard")

// ErrNoGuard is returned by the registered zmq4 transport when a socket was
// not created by this package (its context carries no guard).
var ErrNoGuard = errors.New("zmtp: socket context carries no guard")

// errPanic marks a socket goroutine that recovered from a panic.
var errPanic = errors.New("zmtp: socket goroutine panicked")

// violation is the error the guard returns from Read. It implements
// net.Error (not a timeout) so that zmq4 marks the connection closed and
// reaps it instead of keeping a dead entry in its writer pool.
type violation struct {
	reason string
	detail string
}

func (v *violation) Error() string   { return "zmtp: guard: " + v.reason + ": " + v.detail }
func (v *violation) Is(t error) bool { return t == ErrRejected }
func (v *violation) Timeout() bool   { return false }
func (v *violation) Temporary() bool { return false }
