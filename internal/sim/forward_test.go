package sim

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
)

// fakeClock moves only when a forward pass sleeps: SleepUntil jumps to
// the pass's end at once.
type fakeClock struct {
	now    time.Time
	sleeps int
}

func (c *fakeClock) Now() time.Time { return c.now }

func (c *fakeClock) SleepUntil(_ context.Context, t time.Time) error {
	c.sleeps++
	if t.After(c.now) {
		c.now = t
	}
	return nil
}

// recordingPrefill is a prefill daemon that notes when each Send came,
// on the fake clock.
type recordingPrefill struct {
	pb.PrefillServiceClient // nil: only Send is called
	clock                   *fakeClock
	sends                   []sentChunk
}

type sentChunk struct {
	at    time.Duration // since the clock's start
	start uint32
	pages int
	last  bool
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (p *recordingPrefill) Send(_ context.Context, in *pb.SendRequest, _ ...grpc.CallOption) (*pb.SendResponse, error) {
	p.sends = append(p.sends, sentChunk{at: p.clock.now.Sub(epoch), start: in.StartPosition, pages: len(in.Pages.Indices), last: in.Last})
	return &pb.SendResponse{}, nil
}

// pacedRun is a run whose prefill daemon records Sends and whose GPU runs
// on a fake clock.
func pacedRun(tokensPerS float64) (*run, *recordingPrefill, *fakeClock) {
	clk := &fakeClock{now: epoch}
	pre := &recordingPrefill{clock: clk}
	cfg := Config{Layout: DemoLayout(), ChunkPages: 16}
	return &run{Sim: &Sim{prefill: pre}, cfg: cfg, gpu: newGPU(tokensPerS, clk)}, pre, clk
}

func pagesOf(n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(i)
	}
	return p
}

// Each chunk's Send comes after its forward pass: chunk tokens /
// PrefillTokensPerS after the previous one, and the last (partial) page
// counts only the tokens it holds.
func TestEachChunksSendComesAfterItsForwardPass(t *testing.T) {
	r, pre, _ := pacedRun(20000)
	// 1000 tokens on 16-token pages: 63 pages, chunks of 16, 16, 16, 15
	// pages holding 256, 256, 256 and 232 tokens.
	rq := request{room: 1, tokens: 1000, pages: 63}
	first, last := r.sendChunks(context.Background(), rq, pagesOf(63), 0)
	if first.IsZero() || last.IsZero() {
		t.Fatalf("sendChunks = %v, %v: want both times", first, last)
	}
	ms := func(x float64) time.Duration { return time.Duration(x * float64(time.Millisecond)) }
	want := []sentChunk{
		{at: ms(12.8), start: 0, pages: 16},
		{at: ms(25.6), start: 16, pages: 16},
		{at: ms(38.4), start: 32, pages: 16},
		{at: ms(50.0), start: 48, pages: 15, last: true},
	}
	if len(pre.sends) != len(want) {
		t.Fatalf("sent %+v, want %+v", pre.sends, want)
	}
	for i, w := range want {
		if pre.sends[i] != w {
			t.Errorf("chunk %d sent %+v, want %+v", i, pre.sends[i], w)
		}
	}
}

// With PrefillTokensPerS 0 there is no model: no forward pass is waited
// for and every chunk goes at once, back to back, as before the model.
func TestNoForwardPassModelSendsChunksBackToBack(t *testing.T) {
	r, pre, clk := pacedRun(0)
	r.sendChunks(context.Background(), request{room: 1, tokens: 1000, pages: 63}, pagesOf(63), 0)
	if clk.sleeps != 0 || len(pre.sends) != 4 {
		t.Fatalf("%d forward passes waited for, %d chunks sent; want 0 and 4", clk.sleeps, len(pre.sends))
	}
	for _, s := range pre.sends {
		if s.at != 0 {
			t.Errorf("chunk at %d sent after %v, want at once", s.start, s.at)
		}
	}
}

// One GPU runs one forward pass at a time: passes asked for at the same
// moment by requests in flight end one after the other, so
// PrefillTokensPerS is the engine's throughput, not each request's; a
// pass asked for once the GPU is idle starts at once.
func TestForwardPassesOfRequestsInFlightShareOneGPU(t *testing.T) {
	clk := &fakeClock{now: epoch}
	g := newGPU(10000, clk)
	var ends []time.Duration
	for range 3 {
		ends = append(ends, g.reserve(1000).Sub(epoch)) // 100 ms each
	}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond}
	for i := range want {
		if ends[i] != want[i] {
			t.Errorf("pass %d asked for at 0 ends at %v, want %v (all ends %v)", i, ends[i], want[i], ends)
		}
	}
	clk.now = epoch.Add(time.Second)
	if end := g.reserve(500).Sub(epoch); end != 1050*time.Millisecond {
		t.Errorf("pass asked for at 1s on an idle GPU ends at %v, want 1.05s", end)
	}
}

// The real clock waits on a timer and gives up when the run stops.
func TestForwardPassEndsWhenTheRunStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	g := newGPU(1, realClock{}) // an hour-long pass
	if err := g.forward(ctx, 3600); !errors.Is(err, context.Canceled) {
		t.Fatalf("forward pass on a stopped run = %v, want context.Canceled", err)
	}
	r, pre, _ := pacedRun(1)
	r.gpu = g
	if first, last := r.sendChunks(ctx, request{room: 1, tokens: 100, pages: 7}, pagesOf(7), 0); !first.IsZero() || !last.IsZero() || len(pre.sends) != 0 {
		t.Errorf("stopped run sent %d chunks (%v, %v), want none", len(pre.sends), first, last)
	}
}
