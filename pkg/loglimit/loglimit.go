package loglimit

import (
	"sync"
	"time"
)

// Limiter holds back, per reason, the lines that come within every of the last one let
// through. Reasons are small integers below the count given to New.
type Limiter[R ~uint8] struct {
	now        func() time.Time
	every      time.Duration
	mu         sync.Mutex
	last       []time.Time
	suppressed []uint64
}

// New returns a limiter for reasons 0..reasons-1 allowing one line per reason per every
// (default 1s) by the clock now (default time.Now).
func New[R ~uint8](reasons R, every time.Duration, now func() time.Time) *Limiter[R] {
	if every <= 0 {
		every = time.Second
	}
	if now == nil {
		now = time.Now
	}
	return &Limiter[R]{now: now, every: every, last: make([]time.Time, reasons), suppressed: make([]uint64, reasons)}
}

// Allow reports whether a line for r may be logged now and, if so, how many lines of r
// were held back since the last one. A reason out of range is always let through.
func (l *Limiter[R]) Allow(r R) (suppressed uint64, ok bool) {
	if int(r) >= len(l.last) {
		return 0, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if !l.last[r].IsZero() && now.Sub(l.last[r]) < l.every {
		l.suppressed[r]++
		return 0, false
	}
	n := l.suppressed[r]
	l.last[r], l.suppressed[r] = now, 0
	return n, true
}
