// Package zmtp is the production conn.Transport: ZeroMQ ROUTER/DEALER
// sockets from github.com/go-zeromq/zmq4 v0.17.0, behind a guard that
// validates every byte a TCP peer sends before the library parses it.
//
// # Design
//
// A Listener is one ROUTER socket; a Conn is one DEALER socket connected
// to exactly one endpoint (a DEALER connected to two endpoints sends every
// message to both). Public addresses are "tcp://host:port"; internally
// they are rewritten to the guarded zmq4 transport registered under
// Scheme ("pdtcp"), whose net.Listener and dialed net.Conn wrap TCP in a
// validating reader. The wrapper finds its settings and counters in the
// zmq4 socket's context, so one registration serves every Transport.
//
// The guard is an incremental ZMTP 3.x parser (parser.go) that sees each
// byte first, in any chunking. It checks the greeting (signature, version
// 3.x, mechanism NULL, as-server 0), then every frame: flag bits, short or
// long size, size against MaxWireFrame/MaxCommand, frames per message,
// command names, READY properties (name length and alphabet, the 4-byte
// value length and the value all inside the body, a Socket-Type zmq4 can
// see with the expected value), ERROR/PING/PONG shapes. On the first
// violation Read returns an error (a net.Error, so zmq4 reaps the
// connection), the connection is closed and the reason counted
// (Stats.Rejected, Options.OnReject, sampled Warn log). An optional
// allow-list of peer networks closes other peers at accept.
//
// zmq4 accepts serially and runs the handshake in its accept loop without a
// deadline, so the guard's listener performs the server handshake itself
// first (one goroutine per connection, bounded in time and number), then
// hands zmq4 a connection whose greeting and READY replay from memory.
// Every write carries a deadline; a peer that stops reading is closed.
//
// # Goroutines and ownership
//
//   - Per Listener: one owner goroutine (listener.run) owns the ROUTER: it
//     alone sends (draining the send queue) and closes; one reader
//     goroutine alone calls Recv and feeds the receive queue. Callers only
//     touch the two channels. If either goroutine panics, or the reader
//     exits while the Listener is open, the owner recovers, counts a
//     restart, closes the socket and binds a fresh ROUTER on the same
//     address after a backoff (R6, R12).
//   - Per Conn: the same owner/reader pair around a DEALER, plus the
//     reconnect loop in the owner (dialer.run): dial under a deadline in a
//     helper goroutine, serve until zmq4 reports the peer gone (io.EOF),
//     close, back off with jitter, dial a fresh DEALER with the same
//     identity. Frames sent while a connection attempt is in progress are
//     held and go out first once it succeeds; those sent while the Conn
//     backs off after a failure are dropped and counted.
//   - Per guarded listener: one accept goroutine and one goroutine per
//     connection in its handshake; Close closes their connections and
//     waits for them.
//   - zmq4's own goroutines (accept, per-connection readers, reaper) end
//     when the owner closes the socket; the owner then drains zmq4's
//     receive queue so none stays blocked on it.
//
// Close on a Listener or Conn returns after all of the above have exited.
//
// # zmq4 v0.17.0 pitfalls this package defends against
//
//   - Three malformed inputs from any TCP peer panic the process inside a
//     library goroutine: a frame header claiming a 2^50-byte body
//     (makeslice), a READY whose property value length is cut short (slice
//     bounds), and a READY without a known Socket-Type (IsCompatible panics
//     on the unknown type; found by FuzzGuard). The guard rejects all three
//     before zmq4 sees them; TestUnguardedZMQ4RouterPanics documents the
//     library bugs in a child process.
//   - A handshake that fails on an incompatible peer type, or on a write
//     error, leaves the connection open in zmq4 (an fd per attempt): the
//     guard accepts only the expected peer type (DEALER at a Listener,
//     ROUTER at a Conn) and closes a connection on any write error.
//   - WithAutomaticReconnect gives up silently after a short budget; it is
//     never used, the Conn owns its reconnect loop.
//   - A socket connected to two endpoints duplicates every message: one
//     DEALER per peer.
//   - Send returning nil does not mean delivered, and Recv returns io.EOF
//     when a peer leaves: the Transport is best effort (see
//     conn.Transport), delivery is built above it.
//   - A slow peer in the handshake blocks zmq4's accept loop; a stalled
//     reader blocks zmq4's writer: handshake deadline and write deadline.
//   - zmq4 surfaces ZMTP commands (PING...) as messages: dropped (counted).
//   - zmq4 has no heartbeats, HWM or CURVE: liveness and authentication
//     (HMAC envelopes) live in package conn.
//
// # Usage
//
//	tr := zmtp.New(zmtp.Options{Logger: log})
//	l, err := tr.Listen(ctx, "tcp://0.0.0.0:8998") // prefilld
//	route, frame, err := l.Recv(ctx)
//	err = l.Send(ctx, route, reply)
//
//	c, err := tr.Dial(ctx, "tcp://prefill-0:8998") // decoded, one per peer
//	err = c.Send(ctx, frame)
//	frame, err = c.Recv(ctx)
//
// The caller's duties:
//
//  1. Treat Send as best effort: acknowledge or bound every frame that
//     matters by a deadline.
//  2. Close every Listener and Conn; Close waits for their goroutines.
//  3. Export Stats (rejections, drops, restarts, reconnects) as metrics,
//     or pass Options.OnReject to count rejections directly.
package zmtp
