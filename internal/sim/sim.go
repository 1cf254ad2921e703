package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// Config describes one simulated workload.
type Config struct {
	// PrefillGRPC and DecodeGRPC are the daemons' gRPC targets
	// ("unix:///path" or "host:port"); Bootstrap is prefilld's ZeroMQ
	// address that decode rooms name.
	PrefillGRPC, DecodeGRPC, Bootstrap string
	// Dir holds the region files (default /dev/shm).
	Dir    string
	Layout Layout
	// Requests of MinTokens..MaxTokens tokens, at most Concurrency at once.
	Requests             int
	MinTokens, MaxTokens int
	Concurrency          int
	// ChunkPages is how many pages each prefill Send hands over (a forward
	// pass of chunked prefill).
	ChunkPages int
	Tick       time.Duration
	// PinBound is the longest a room may take to reach a terminal state
	// (the sum of the daemons' deadlines plus slack); a room past it is
	// reported as pinned, which must never happen.
	PinBound time.Duration
	Seed     uint64
	Faults   Faults
	// NoVerify skips filling source pages with the pattern and checking
	// the destination (for benchmarks: the bytes still move, but nobody
	// spends CPU proving them).
	NoVerify bool
	// Progress, if set, is called after each request ends.
	Progress func(done, total int)
}

// Faults mixes misbehaviour into the workload; each is a fraction of the
// requests (0..1).
type Faults struct {
	AbortPrefill float64 // the prefill scheduler aborts at a random moment
	AbortDecode  float64 // the decode scheduler aborts at a random moment
	StallDecode  float64 // the decode scheduler never sends metadata
	StallPrefill float64 // the prefill scheduler never sends the last chunk
}

func (f Faults) any() bool {
	return f.AbortPrefill+f.AbortDecode+f.StallDecode+f.StallPrefill > 0
}

// Report is what a run saw.
type Report struct {
	Requests int
	// Outcomes counts rooms by "<side>:<state or reason>", e.g.
	// "decode:success", "prefill:timeout:waiting_for_input".
	Outcomes map[string]int
	// Faults counts the faults injected, by kind.
	Faults map[string]int
	// Verified counts rooms whose every destination byte was checked;
	// Corrupt those with a wrong byte (must be 0); LateWrites those whose
	// pages changed after Failed was visible (must be 0, R7).
	Verified, Corrupt, LateWrites int
	// Pinned counts rooms that did not end within PinBound (must be 0).
	Pinned int
	// Bytes is KV bytes moved by rooms that succeeded.
	Bytes   int64
	Elapsed time.Duration
	// LastChunkToSuccess is, per successful room, the time from the last
	// Send returning to decode reporting Success.
	LastChunkToSuccess []time.Duration
	// WorstTerminal is the longest time any room took to reach a terminal
	// state on both sides.
	WorstTerminal time.Duration
}

// Percentile returns the p-th percentile (0..100) of LastChunkToSuccess.
func (r *Report) Percentile(p float64) time.Duration {
	if len(r.LastChunkToSuccess) == 0 {
		return 0
	}
	s := slices.Clone(r.LastChunkToSuccess)
	slices.Sort(s)
	i := int(p / 100 * float64(len(s)-1))
	return s[i]
}

// GBps is the goodput of successful rooms.
func (r *Report) GBps() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Bytes) / r.Elapsed.Seconds() / 1e9
}

func (c *Config) defaults() {
	if c.Dir == "" {
		c.Dir = "/dev/shm"
	}
	if c.Layout.Layers == 0 {
		c.Layout = DemoLayout()
	}
	if c.Requests == 0 {
		c.Requests = 100
	}
	if c.MinTokens == 0 {
		c.MinTokens = 64
	}
	if c.MaxTokens == 0 {
		c.MaxTokens = 1024
	}
	if c.Concurrency == 0 {
		c.Concurrency = 8
	}
	if c.ChunkPages == 0 {
		c.ChunkPages = 16
	}
	if c.Tick == 0 {
		c.Tick = 2 * time.Millisecond
	}
	if c.PinBound == 0 {
		c.PinBound = 2 * time.Minute
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
}

// engine is one side's KV memory, as the engine maps it.
type engine struct {
	region *transfer.Region
	path   string
	pages  *allocator
	aux    *allocator
}

func newEngine(dir string, tl transfer.Layout) (*engine, error) {
	path, err := transfer.CreateRegionFile(dir, tl)
	if err != nil {
		return nil, err
	}
	r, err := transfer.OpenRegion(path, tl)
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	return &engine{region: r, path: path, pages: newAllocator(tl.Buffers[0].Pages()), aux: newAllocator(tl.Aux.Rows)}, nil
}

func (e *engine) close() {
	e.region.Close()
	os.Remove(e.path)
}

func dial(target string) (*grpc.ClientConn, error) {
	if len(target) > 0 && target[0] != 'u' {
		target = "passthrough:///" + target
	}
	return grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func layoutProto(tl transfer.Layout) *pb.RegionLayout {
	l := &pb.RegionLayout{Rank: &pb.Rank{TpRank: uint32(tl.TPRank), TpSize: uint32(tl.TPSize)},
		Aux: &pb.AuxSpec{Offset: uint64(tl.Aux.Offset), RowLen: uint32(tl.Aux.RowLen), Rows: uint32(tl.Aux.Rows)}}
	for _, b := range tl.Buffers {
		l.Buffers = append(l.Buffers, &pb.BufferSpec{Offset: uint64(b.Offset), Length: uint64(b.Length), ItemLen: uint32(b.ItemLen)})
	}
	return l
}

// Run drives the workload to the end and reports. It returns an error only
// when the run could not be set up; room failures are in the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	tl, err := cfg.Layout.Transfer()
	if err != nil {
		return nil, err
	}
	if int64((cfg.MaxTokens+cfg.Layout.PageTokens-1)/cfg.Layout.PageTokens) > cfg.Layout.Pages {
		return nil, fmt.Errorf("sim: a %d-token request does not fit %d pages", cfg.MaxTokens, cfg.Layout.Pages)
	}
	pre, err := newEngine(cfg.Dir, tl)
	if err != nil {
		return nil, err
	}
	defer pre.close()
	dec, err := newEngine(cfg.Dir, tl)
	if err != nil {
		return nil, err
	}
	defer dec.close()

	pconn, err := dial(cfg.PrefillGRPC)
	if err != nil {
		return nil, err
	}
	defer pconn.Close()
	dconn, err := dial(cfg.DecodeGRPC)
	if err != nil {
		return nil, err
	}
	defer dconn.Close()
	s := &run{cfg: cfg, tl: tl, pre: pre, dec: dec,
		prefill: pb.NewPrefillServiceClient(pconn), decode: pb.NewDecodeServiceClient(dconn),
		rep:  &Report{Requests: cfg.Requests, Outcomes: map[string]int{}, Faults: map[string]int{}},
		stop: make(chan struct{})}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = s.prefill.RegisterRegion(rctx, &pb.PrefillServiceRegisterRegionRequest{RegionPath: pre.path, Layout: layoutProto(tl)})
	if err == nil {
		_, err = s.decode.RegisterRegion(rctx, &pb.DecodeServiceRegisterRegionRequest{RegionPath: dec.path, Layout: layoutProto(tl)})
	}
	cancel()
	if err != nil {
		return nil, fmt.Errorf("register regions: %w", err)
	}

	start := time.Now()
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5DEECE66D))
	base := rng.Uint64N(1<<40) + 1
	sem := make(chan struct{}, cfg.Concurrency)
	var wg sync.WaitGroup
	var done atomic.Int64
	go func() {
		<-ctx.Done()
		s.stopOnce.Do(func() { close(s.stop) })
		pre.pages.wakeAll()
		dec.pages.wakeAll()
	}()
loop:
	for i := 0; i < cfg.Requests; i++ {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			break loop
		}
		rq := s.newRequest(base+uint64(i), rng)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			s.serve(ctx, rq)
			n := done.Add(1)
			if cfg.Progress != nil {
				cfg.Progress(int(n), cfg.Requests)
			}
		}()
	}
	wg.Wait()
	s.stopOnce.Do(func() { close(s.stop) })
	s.rep.Elapsed = time.Since(start)
	return s.rep, ctx.Err()
}

type run struct {
	cfg      Config
	tl       transfer.Layout
	pre, dec *engine
	prefill  pb.PrefillServiceClient
	decode   pb.DecodeServiceClient
	stop     chan struct{}
	stopOnce sync.Once

	mu  sync.Mutex
	rep *Report
}

func (s *run) record(f func(r *Report)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s.rep)
}
