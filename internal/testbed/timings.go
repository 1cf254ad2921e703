package testbed

import (
	"fmt"
	"time"
)

// Timings are the daemons' deadlines, passed as flags (Args), and the
// bounds a scenario holds a room to, computed from them.
type Timings struct {
	Bootstrap, Waiting, Idle, Linger, Heartbeat time.Duration
	Misses                                      int
}

// ShortTimings are deadlines short enough that a stuck room fails in
// seconds and a suite stays fast.
func ShortTimings() Timings {
	return Timings{Bootstrap: 2 * time.Second, Waiting: 2 * time.Second, Idle: 2 * time.Second,
		Linger: 3 * time.Second, Heartbeat: 200 * time.Millisecond, Misses: 3}
}

// Args are the flags that give a daemon these deadlines.
func (tm Timings) Args() []string {
	return []string{
		"--bootstrap-timeout=" + tm.Bootstrap.String(), "--waiting-timeout=" + tm.Waiting.String(),
		"--transfer-idle-timeout=" + tm.Idle.String(), "--clear-linger=" + tm.Linger.String(),
		"--heartbeat-interval=" + tm.Heartbeat.String(), fmt.Sprintf("--heartbeat-misses=%d", tm.Misses),
		"--drain-timeout=1s", "--log-level=info",
	}
}

// PeerBound is how long a lost peer may go unnoticed: the missed
// heartbeats, a tick of the daemon, and the observer's own polling.
func (tm Timings) PeerBound() time.Duration {
	return time.Duration(tm.Misses)*tm.Heartbeat + time.Second
}

// RoomBound is the longest any room may take to reach a terminal state:
// each state's deadline in turn, a lost peer, and slack for the
// schedulers' ticks and a loaded 2-core machine.
func (tm Timings) RoomBound() time.Duration {
	return tm.Bootstrap + tm.Waiting + tm.Idle + tm.PeerBound() + 2*time.Second
}

// Eventually polls cond every 50 ms until it holds or bound passes; it
// returns how long it took and whether it held.
func Eventually(bound time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > bound {
			return time.Since(start), false
		}
		time.Sleep(50 * time.Millisecond)
	}
}
