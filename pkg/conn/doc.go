// Package conn is pdlink's daemon-to-daemon control plane: the bootstrap
// socket, frames, peers, heartbeats, and the sender/receiver managers that
// turn frames into room events for package poll.
//
// The Transport interface (transport.go) is best-effort frame movement; the
// ZeroMQ implementation lives in package zmtp, the in-memory twin here.
// Everything that makes delivery reliable sits above it.
package conn
