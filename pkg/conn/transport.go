package conn

import (
	"context"
	"errors"
)

// Transport moves opaque control frames (serialised Envelopes) between
// daemons. It is best effort, like ZeroMQ itself: a nil error from Send does
// not mean the peer got the frame, and a frame may arrive twice or never.
// Delivery (acks, retries, dedupe) and liveness (heartbeats, epochs) are
// built above it in this package, so every implementation stays small:
// the ZeroMQ one (package zmtp) for production, and the in-memory twin
// (MemNetwork) with loss, duplication, reordering, delay, partition and
// restart controls for protocol tests.
//
// Topology: prefilld binds one Listener; each decoded dials one Conn per
// prefill daemon it talks to (never one socket to two peers: ZeroMQ would
// duplicate every frame to both).
type Transport interface {
	// Listen binds addr (e.g. "tcp://127.0.0.1:8998"; port 0 picks one).
	Listen(ctx context.Context, addr string) (Listener, error)
	// Dial returns a Conn to the Listener at addr. It does not wait for the
	// peer to be up: frames sent before it is are lost, as in ZeroMQ.
	Dial(ctx context.Context, addr string) (Conn, error)
}

// Listener is a bound socket that exchanges frames with many dialers. Each
// dialer is named by a Route the Listener assigns; a dialer that reconnects
// may get a new Route.
type Listener interface {
	// Recv blocks until a frame arrives, ctx is done, or the Listener is
	// closed (ErrClosed).
	Recv(ctx context.Context) (Route, []byte, error)
	// Send queues a frame for the dialer behind route. Best effort. It
	// waits for room in its queue at most until ctx is done; with a ctx
	// already done it queues the frame if there is room and otherwise
	// returns at once (the link always sends so: see noWait).
	Send(ctx context.Context, route Route, frame []byte) error
	// Addr is the bound address, with the real port when 0 was asked.
	Addr() string
	Close() error
}

// Conn is one dialed socket to one Listener.
type Conn interface {
	// Recv blocks until a frame arrives, ctx is done, or the Conn is closed
	// (ErrClosed).
	Recv(ctx context.Context) ([]byte, error)
	// Send queues a frame for the Listener. Best effort, and bounded by
	// ctx as Listener.Send.
	Send(ctx context.Context, frame []byte) error
	Close() error
}

// Route names one dialer as seen by a Listener.
type Route string

// ErrClosed is returned by Recv and Send on a closed Listener or Conn.
var ErrClosed = errors.New("conn: transport closed")

// MaxFrameSize bounds one control frame on every transport; larger frames
// are refused by the sender and dropped (and counted) by the receiver.
const MaxFrameSize = 1 << 20

// noWait is the context of every send the link makes: already done, so a
// transport whose queue is full refuses the frame at once instead of
// holding the caller, which may be the room owner performing effects (one
// stalled peer would stop every room) or a socket reader answering an
// ACK. A refused frame is counted (Counters.SendErrors); a reliable one
// stays in the outbox and goes again at its retransmit, a heartbeat or an
// ACK is sent again by its own rule.
var noWait = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()
