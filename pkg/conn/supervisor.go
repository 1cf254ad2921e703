package conn

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// supervisor runs a node's long-lived goroutines (receive loops, the tick
// loop) and restarts any that panics or fails (R6): the panic is
// recovered, logged at Error with its stack, counted, and the worker runs
// again after a backoff (none for the first restart, then doubling up to
// maxRestartBackoff; a run that lasted longer than that resets it).
type supervisor struct {
	ctx      context.Context
	wg       sync.WaitGroup
	clock    Clock
	log      *zap.Logger
	restarts *atomic.Uint64
}

const (
	minRestartBackoff = 10 * time.Millisecond
	maxRestartBackoff = time.Second
)

// errPanic marks a worker run that ended in a panic.
var errPanic = errors.New("conn: worker panicked")

// Go runs fn until it returns nil or the supervisor's context ends.
func (s *supervisor) Go(name string, fn func(ctx context.Context) error) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		var backoff time.Duration
		for {
			started := s.clock.Now()
			err := s.runOnce(name, fn)
			if err == nil || s.ctx.Err() != nil {
				return
			}
			s.restarts.Add(1)
			if s.clock.Now().Sub(started) > maxRestartBackoff {
				backoff = 0
			}
			if errors.Is(err, errPanic) {
				s.log.Error("worker panicked, restarting", zap.String("worker", name), zap.Error(err), zap.Duration("backoff", backoff))
			} else {
				s.log.Warn("worker failed, restarting", zap.String("worker", name), zap.Error(err), zap.Duration("backoff", backoff))
			}
			if backoff > 0 && !s.sleep(backoff) {
				return
			}
			backoff = min(max(2*backoff, minRestartBackoff), maxRestartBackoff)
		}
	}()
}

func (s *supervisor) runOnce(name string, fn func(ctx context.Context) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %s: %v\n%s", errPanic, name, p, debug.Stack())
		}
	}()
	return fn(s.ctx)
}

// sleep waits d on the clock; false if the context ended first.
func (s *supervisor) sleep(d time.Duration) bool {
	done := make(chan struct{})
	t := s.clock.AfterFunc(d, func() { close(done) })
	select {
	case <-done:
		return true
	case <-s.ctx.Done():
		t.Stop()
		return false
	}
}

// Wait blocks until every worker returned.
func (s *supervisor) Wait() { s.wg.Wait() }
