package sim

import (
	"context"
	"sync"
	"time"
)

// clock is what the forward-pass model waits on: real timers, or a fake
// one in tests.
type clock interface {
	Now() time.Time
	// SleepUntil returns at t, or with ctx's error once ctx is done.
	SleepUntil(ctx context.Context, t time.Time) error
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// SleepUntil waits on a timer: a simulated forward pass costs the pdctl
// process no CPU, so the schedulers' CPU it reports is their own.
func (realClock) SleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// gpu is the simulated prefill engine's accelerator. Forward passes run
// one at a time across every request in flight, in the order they are
// asked for, as one GPU runs one batch after the other: tokensPerS is the
// engine's throughput, shared by the requests, not each request's. A nil
// gpu (no model) takes no time.
type gpu struct {
	clock      clock
	tokensPerS float64

	mu     sync.Mutex
	freeAt time.Time // when the last forward pass asked for ends
}

func newGPU(tokensPerS float64, c clock) *gpu {
	if tokensPerS <= 0 {
		return nil
	}
	return &gpu{clock: c, tokensPerS: tokensPerS}
}

// passTime is the forward-pass time of a chunk of tokens.
func (g *gpu) passTime(tokens int) time.Duration {
	return time.Duration(float64(tokens) / g.tokensPerS * float64(time.Second))
}

// reserve books the next forward pass of tokens: it starts when the GPU is
// free (now, or once the passes booked before it ended) and returns its
// end.
func (g *gpu) reserve(tokens int) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	start := g.clock.Now()
	if g.freeAt.After(start) {
		start = g.freeAt
	}
	g.freeAt = start.Add(g.passTime(tokens))
	return g.freeAt
}

// forward runs a forward pass over tokens: it returns once the chunk is
// computed, or with ctx's error.
func (g *gpu) forward(ctx context.Context, tokens int) error {
	if g == nil || tokens <= 0 {
		return nil
	}
	return g.clock.SleepUntil(ctx, g.reserve(tokens))
}
