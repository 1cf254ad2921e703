package sim

import (
	"context"
	"errors"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
)

// fakeClock moves only when a forward pass sleeps: SleepUntil jumps to
// the pass's end at once.
type fakeClock struct {
	mu     sync.Mutex // ranks send from goroutines of their own
	now    time.Time
	sleeps int
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) SleepUntil(_ context.Context, t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
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
	sendTakes               time.Duration // how long each Send call lasts
	sends                   []sentChunk
}

type sentChunk struct {
	at    time.Duration // since the clock's start
	start uint32
	pages int
	last  bool
	rank  *pb.Rank
	first int32 // the first page index
	// buffers is how many buffers the Send named (0: all).
	buffers int
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (p *recordingPrefill) Send(_ context.Context, in *pb.SendRequest, _ ...grpc.CallOption) (*pb.SendResponse, error) {
	p.clock.mu.Lock()
	defer p.clock.mu.Unlock()
	first := int32(-1) // a last Send of no pages: decode holds every position
	if len(in.Pages.Indices) > 0 {
		first = in.Pages.Indices[0]
	}
	p.sends = append(p.sends, sentChunk{at: p.clock.now.Sub(epoch), start: in.StartPosition, pages: len(in.Pages.Indices), last: in.Last, rank: in.Rank,
		first: first, buffers: len(in.Buffers)})
	p.clock.now = p.clock.now.Add(p.sendTakes)
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
	sent := r.sendChunks(context.Background(), rq, [][]int32{pagesOf(63)}, []int32{0}, 0)
	if sent.first.IsZero() || sent.last.IsZero() {
		t.Fatalf("sendChunks = %v, %v: want both times", sent.first, sent.last)
	}
	ms := func(x float64) time.Duration { return time.Duration(math.Round(x * float64(time.Millisecond))) }
	want := []sentChunk{
		{at: ms(12.8), start: 0, pages: 16},
		{at: ms(25.6), start: 16, pages: 16, first: 16},
		{at: ms(38.4), start: 32, pages: 16, first: 32},
		{at: ms(50.0), start: 48, pages: 15, last: true, first: 48},
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
	r.sendChunks(context.Background(), request{room: 1, tokens: 1000, pages: 63}, [][]int32{pagesOf(63)}, []int32{0}, 0)
	if clk.sleeps != 0 || len(pre.sends) != 4 {
		t.Fatalf("%d forward passes waited for, %d chunks sent; want 0 and 4", clk.sleeps, len(pre.sends))
	}
	for _, s := range pre.sends {
		if s.at != 0 {
			t.Errorf("chunk at %d sent after %v, want at once", s.start, s.at)
		}
	}
}

// A chunk's Send does not hold the GPU: the next chunk's forward pass runs
// while the previous chunk is handed over, so a Send slower than a pass
// delays the next Send only to its own return, not by a pass more.
func TestForwardPassesRunWhileChunksAreHandedOver(t *testing.T) {
	r, pre, _ := pacedRun(20000)
	pre.sendTakes = 20 * time.Millisecond // passes take 12.8 ms
	r.sendChunks(context.Background(), request{room: 1, tokens: 1000, pages: 63}, [][]int32{pagesOf(63)}, []int32{0}, 0)
	ms := func(x float64) time.Duration { return time.Duration(math.Round(x * float64(time.Millisecond))) }
	want := []time.Duration{ms(12.8), ms(32.8), ms(52.8), ms(72.8)}
	if len(pre.sends) != len(want) {
		t.Fatalf("sent %+v, want 4 chunks", pre.sends)
	}
	for i, w := range want {
		if pre.sends[i].at != w {
			t.Errorf("chunk %d sent at %v, want %v", i, pre.sends[i].at, w)
		}
	}
}

// One GPU prefills one request at a time, first come first served, each
// request's chunks back to back: requests booked at the same moment are
// prefilled one after the other, so PrefillTokensPerS is the engine's
// throughput, not each request's; a request booked once the GPU is idle
// starts at once.
func TestRequestsInFlightArePrefilledOneAfterTheOtherOnOneGPU(t *testing.T) {
	clk := &fakeClock{now: epoch}
	g := newGPU(10000, clk) // 1000 tokens: 100 ms
	since := func(ts []time.Time) []time.Duration {
		var out []time.Duration
		for _, x := range ts {
			out = append(out, x.Sub(epoch))
		}
		return out
	}
	a, b := since(g.book([]int{1000, 1000})), since(g.book([]int{500}))
	if !slices.Equal(a, []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}) || !slices.Equal(b, []time.Duration{250 * time.Millisecond}) {
		t.Errorf("requests booked together: chunks end at %v and %v, want [100ms 200ms] and [250ms]", a, b)
	}
	clk.now = epoch.Add(time.Second)
	if c := since(g.book([]int{500})); !slices.Equal(c, []time.Duration{1050 * time.Millisecond}) {
		t.Errorf("request booked at 1s on an idle GPU: chunk ends at %v, want [1.05s]", c)
	}
}

// The real clock waits on a timer and gives up when the run stops.
func TestForwardPassEndsWhenTheRunStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	g := newGPU(1, realClock{})
	if err := g.computed(ctx, g.book([]int{3600})[0]); !errors.Is(err, context.Canceled) { // an hour-long pass
		t.Fatalf("forward pass on a stopped run = %v, want context.Canceled", err)
	}
	r, pre, _ := pacedRun(1)
	r.gpu = g
	if sent := r.sendChunks(ctx, request{room: 1, tokens: 100, pages: 7}, [][]int32{pagesOf(7)}, []int32{0}, 0); !sent.first.IsZero() || !sent.last.IsZero() || len(pre.sends) != 0 {
		t.Errorf("stopped run sent %d chunks (%v, %v), want none", len(pre.sends), sent.first, sent.last)
	}
}

// At TP 2 each prefill rank sends its own pages, naming its rank, each
// chunk once its forward pass (booked once for both ranks, which run the
// passes in lockstep) is over, whatever the other rank does: rank 1 is
// slow (SendDelay), rank 0 goes on.
func TestEachPrefillRankSendsItsOwnPagesOnTheSharedForwardPasses(t *testing.T) {
	r, pre, clk := pacedRun(20000)
	r.cfg.SendDelay = func(rank int) time.Duration {
		if rank == 1 {
			return time.Millisecond // real time: the fake clock does not see it
		}
		return 0
	}
	src := [][]int32{pagesOf(63), pagesOf(63)}
	for i := range src[1] {
		src[1][i] += 100 // rank 1's own pages
	}
	sent := r.sendChunks(context.Background(), request{room: 1, tokens: 1000, pages: 63}, src, []int32{0, 1}, 0)
	if sent.first.IsZero() || sent.last.IsZero() {
		t.Fatalf("sendChunks = %v, %v: want both times", sent.first, sent.last)
	}
	if clk.sleeps != 8 {
		t.Errorf("%d forward passes waited for, want 4 per rank", clk.sleeps)
	}
	ms := func(x float64) time.Duration { return time.Duration(math.Round(x * float64(time.Millisecond))) }
	passEnds := []time.Duration{ms(12.8), ms(25.6), ms(38.4), ms(50.0)}
	byRank := map[uint32][]sentChunk{}
	for _, s := range pre.sends {
		if s.rank.GetTpSize() != 2 {
			t.Fatalf("a Send named rank %v, want a rank of 2", s.rank)
		}
		byRank[s.rank.GetTpRank()] = append(byRank[s.rank.GetTpRank()], s)
	}
	for rank := range uint32(2) {
		sent := byRank[rank]
		if len(sent) != 4 {
			t.Fatalf("rank %d sent %d chunks, want 4", rank, len(sent))
		}
		for i, c := range sent {
			if c.start != uint32(16*i) || c.first != src[rank][16*i] || c.at < passEnds[i] || c.last != (i == 3) {
				t.Errorf("rank %d chunk %d: %+v, want position %d from page %d sent at or after its pass end %v", rank, i, c, 16*i, src[rank][16*i], passEnds[i])
			}
		}
	}
}
