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

// gpu is the simulated prefill engine's accelerator. It prefills one
// request at a time, first come first served, and runs a request's chunks
// back to back (SGLang's scheduler continues the request being chunked
// before it takes a new one): tokensPerS is the engine's throughput,
// shared by the requests in flight, not each request's. The scheduler's
// Send of a chunk does not hold the GPU: the next chunk's forward pass
// runs while the previous chunk is being handed over. A nil gpu (no
// model) takes no time.
type gpu struct {
	clock      clock
	tokensPerS float64

	mu     sync.Mutex
	freeAt time.Time // when the last request booked is prefilled
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

// book queues a request's prefill, chunk by chunk (tokens per chunk): it
// starts when the GPU is free (now, or once the requests booked before it
// are prefilled) and returns when each chunk's forward pass ends. A nil
// gpu returns nil.
func (g *gpu) book(chunks []int) []time.Time {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	at := g.clock.Now()
	if g.freeAt.After(at) {
		at = g.freeAt
	}
	ends := make([]time.Time, len(chunks))
	for i, tokens := range chunks {
		at = at.Add(g.passTime(tokens))
		ends[i] = at
	}
	g.freeAt = at
	return ends
}

// computed returns once a chunk booked to end at end is computed, or with
// ctx's error.
func (g *gpu) computed(ctx context.Context, end time.Time) error {
	return g.clock.SleepUntil(ctx, end)
}
