package conn

import "sync/atomic"

// Direction of a frame.
type Direction uint8

// Directions.
const (
	Sent Direction = iota
	Received
)

func (d Direction) String() string {
	if d == Sent {
		return "out"
	}
	return "in"
}

// counters are a node's totals; every field is atomic so the metrics
// collector reads them without locks.
type counters struct {
	frames       [2][numFrameTypes]atomic.Uint64
	rejected     [numRejectReasons]atomic.Uint64
	retransmits  atomic.Uint64
	giveUps      atomic.Uint64
	sendErrors   atomic.Uint64
	restarts     atomic.Uint64
	peerLost     atomic.Uint64
	peerRestarts atomic.Uint64
	peerGoodbyes atomic.Uint64
	dropped      atomic.Uint64 // transitions dropped by slow subscribers
}

// Counters is a snapshot of a node's frame and peer counters, for package
// metrics (pdlink_frames_total{type,dir}, pdlink_frames_rejected_total{reason},
// pdlink_peers{state} and the worker restarts of R6).
type Counters struct {
	frames   [2][numFrameTypes]uint64
	rejected [numRejectReasons]uint64
	// Retransmits counts reliable frames sent again for want of an ACK.
	Retransmits uint64
	// GiveUps counts reliable frames abandoned at their deadline.
	GiveUps uint64
	// SendErrors counts frames the transport refused.
	SendErrors uint64
	// WorkerRestarts counts supervised goroutines restarted after a panic
	// or a failure (R6).
	WorkerRestarts uint64
	// PeersLost and PeerRestarts count peers declared lost (heartbeats
	// missed) and peers seen restarted (new epoch), R10.
	PeersLost    uint64
	PeerRestarts uint64
	// PeerGoodbyes counts peers forgotten because they said goodbye (a
	// planned stop): they are neither lost nor restarted.
	PeerGoodbyes uint64
	// PeersUp and PeersDown are gauges: known peers heard from within the
	// heartbeat bound, and the others.
	PeersUp   int
	PeersDown int
	// WatchDropped counts transitions slow subscribers missed.
	WatchDropped uint64
}

// countPeer adds one known peer to the PeersUp or PeersDown gauge.
func (c *Counters) countPeer(up bool) {
	if up {
		c.PeersUp++
	} else {
		c.PeersDown++
	}
}

// Frames returns the frames of type t in direction d.
func (c Counters) Frames(t FrameType, d Direction) uint64 {
	if t >= numFrameTypes || d > Received {
		return 0
	}
	return c.frames[d][t]
}

// Rejected returns the frames rejected with reason r.
func (c Counters) Rejected(r RejectReason) uint64 {
	if r >= numRejectReasons {
		return 0
	}
	return c.rejected[r]
}

// RejectedTotal returns every rejected frame.
func (c Counters) RejectedTotal() uint64 {
	var n uint64
	for _, v := range c.rejected {
		n += v
	}
	return n
}

func (c *counters) snapshot() Counters {
	var s Counters
	for d := range c.frames {
		for t := range c.frames[d] {
			s.frames[d][t] = c.frames[d][t].Load()
		}
	}
	for r := range c.rejected {
		s.rejected[r] = c.rejected[r].Load()
	}
	s.Retransmits = c.retransmits.Load()
	s.GiveUps = c.giveUps.Load()
	s.SendErrors = c.sendErrors.Load()
	s.WorkerRestarts = c.restarts.Load()
	s.PeersLost = c.peerLost.Load()
	s.PeerRestarts = c.peerRestarts.Load()
	s.PeerGoodbyes = c.peerGoodbyes.Load()
	s.WatchDropped = c.dropped.Load()
	return s
}
