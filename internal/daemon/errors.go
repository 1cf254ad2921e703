package daemon

import "errors"

// ErrStopTimeout: after SIGTERM, the drain or a component did not stop
// within --drain-timeout + StopBound, and the daemon exits without it.
var ErrStopTimeout = errors.New("stop: components did not stop within the drain bound")
