package zmtp

import (
	"net/netip"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/conn"
)

// Options configure a Transport. The zero value is usable: every field has
// a default.
type Options struct {
	// Logger receives lifecycle logs (Info), recovered faults (Warn) and
	// guard rejections (Warn, sampled: at most a few per second). Default
	// zap.NewNop().
	Logger *zap.Logger

	// OnReject, if set, is called once per connection the guard closes,
	// with its reason (one of the Reason constants). It runs on a network
	// goroutine and must not block.
	OnReject func(reason string)

	// AllowedNetworks, if not empty, is the set of peer networks accepted
	// by a Listener; any other peer is closed at accept and counted as
	// ReasonPeerRefused. Empty allows every peer.
	AllowedNetworks []netip.Prefix

	// MaxWireFrame bounds one message frame (and one multipart message)
	// on the wire, as declared in its header. Default conn.MaxFrameSize +
	// 4 KiB. Frames over conn.MaxFrameSize but within this bound are
	// accepted by the guard and dropped (counted) by Recv.
	MaxWireFrame uint64
	// MaxCommand bounds one ZMTP command frame. Default 16 KiB.
	MaxCommand uint64
	// MaxParts bounds the frames of one multipart message. Default 4.
	MaxParts int

	// HandshakeTimeout bounds the peer's greeting and READY. Default 5s.
	HandshakeTimeout time.Duration
	// MaxPendingHandshakes bounds accepted connections still in their
	// handshake; more are closed at once (ReasonHandshakeOverload).
	// Default 64.
	MaxPendingHandshakes int
	// WriteTimeout bounds every write to a peer; a stalled peer is closed
	// (ReasonWriteStall). Default 5s.
	WriteTimeout time.Duration

	// DialTimeout bounds one connection attempt of a Conn (TCP connect).
	// Default 2s.
	DialTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the backoff between reconnect
	// attempts (and between socket restarts). Each wait is drawn in
	// [d/2, d] where d doubles from ReconnectMin up to ReconnectMax.
	// Defaults 50ms and 2s.
	ReconnectMin, ReconnectMax time.Duration

	// SendQueue and RecvQueue size the per-socket frame queues. Defaults
	// 1024 each.
	SendQueue, RecvQueue int
}

func (o Options) withDefaults() Options {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	setDefault(&o.MaxWireFrame, conn.MaxFrameSize+4<<10)
	setDefault(&o.MaxCommand, 16<<10)
	setDefault(&o.MaxParts, 4)
	setDefault(&o.HandshakeTimeout, 5*time.Second)
	setDefault(&o.MaxPendingHandshakes, 64)
	setDefault(&o.WriteTimeout, 5*time.Second)
	setDefault(&o.DialTimeout, 2*time.Second)
	setDefault(&o.ReconnectMin, 50*time.Millisecond)
	setDefault(&o.ReconnectMax, 2*time.Second)
	if o.ReconnectMax < o.ReconnectMin {
		o.ReconnectMax = o.ReconnectMin
	}
	setDefault(&o.SendQueue, 1024)
	setDefault(&o.RecvQueue, 1024)
	return o
}

func setDefault[T int | uint64 | time.Duration](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}

// Drop reasons counted in Stats.Dropped: frames that reached this process
// but were not delivered by Recv (or not sent by Send).
const (
	// DropOversize: a received frame over conn.MaxFrameSize.
	DropOversize = "oversize"
	// DropBadParts: a received message with the wrong number of frames.
	DropBadParts = "bad_parts"
	// DropCommand: a ZMTP command (PING, ERROR...) surfaced by zmq4 as a
	// message.
	DropCommand = "command"
	// DropDisconnected: a frame queued by Conn.Send while the Conn backed
	// off after a failed connection attempt, or held during an attempt
	// that failed.
	DropDisconnected = "disconnected"
	// DropSendError: zmq4 returned an error from Send (the frame may or
	// may not have left).
	DropSendError = "send_error"
)

var dropReasons = []string{DropOversize, DropBadParts, DropCommand, DropDisconnected, DropSendError}

// Stats is a snapshot of a Transport's counters, cumulative since New.
type Stats struct {
	// Rejected counts connections closed by the guard, by Reason*.
	Rejected map[string]uint64
	// Dropped counts frames dropped, by Drop*.
	Dropped map[string]uint64
	// Restarts counts socket goroutines that panicked or died unexpectedly
	// and whose socket was re-created.
	Restarts uint64
	// Reconnects counts Conn connections lost (peer gone, guard
	// rejection, panic) and re-dialed. Failed dial attempts are retried
	// with backoff and not counted here.
	Reconnects uint64
}

// counters hold the Transport's statistics. The maps are written only in
// newCounters, so concurrent reads need no lock.
type counters struct {
	rejected   map[string]*atomic.Uint64
	dropped    map[string]*atomic.Uint64
	restarts   atomic.Uint64
	reconnects atomic.Uint64
}

func newCounters() *counters {
	c := &counters{rejected: map[string]*atomic.Uint64{}, dropped: map[string]*atomic.Uint64{}}
	for _, r := range rejectReasons {
		c.rejected[r] = new(atomic.Uint64)
	}
	for _, r := range dropReasons {
		c.dropped[r] = new(atomic.Uint64)
	}
	return c
}

func (c *counters) drop(reason string) { c.dropped[reason].Add(1) }

func (c *counters) dropN(reason string, n int) { c.dropped[reason].Add(uint64(n)) }

func (c *counters) snapshot() Stats {
	s := Stats{
		Rejected:   make(map[string]uint64, len(c.rejected)),
		Dropped:    make(map[string]uint64, len(c.dropped)),
		Restarts:   c.restarts.Load(),
		Reconnects: c.reconnects.Load(),
	}
	for k, v := range c.rejected {
		s.Rejected[k] = v.Load()
	}
	for k, v := range c.dropped {
		s.Dropped[k] = v.Load()
	}
	return s
}
