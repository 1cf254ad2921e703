package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/rankmap"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// Config describes one simulated workload.
type Config struct {
	// PrefillGRPC and DecodeGRPC are the daemons' gRPC targets
	// ("unix:///path" or "host:port"); Bootstrap is prefilld's ZeroMQ
	// address that decode rooms name.
	PrefillGRPC, DecodeGRPC, Bootstrap string
	// Dir holds the region files (default /dev/shm): it must lie under
	// both daemons' --region-dir. DecodeDir, if set, holds the decode
	// engine's instead, for daemons that share no region directory (two
	// pods).
	Dir       string
	DecodeDir string
	Layout    Layout
	// PrefillTP and DecodeTP are each engine's tensor-parallel size (0: 1). Every rank is its
	// own simulated scheduler, as SGLang runs one per rank: its own region file and pages,
	// its own Open, Send and SendMetadata naming its rank; transfer.PlanRanks says which
	// prefill rank's bytes each decode rank must end up with.
	PrefillTP, DecodeTP int
	// Requests of MinTokens..MaxTokens tokens, at most Concurrency at once.
	Requests             int
	MinTokens, MaxTokens int
	Concurrency          int
	// ChunkPages is how many pages each prefill Send hands over (a forward
	// pass of chunked prefill).
	ChunkPages int
	// PrefillTokensPerS models chunked prefill on one GPU: each chunk's
	// Send comes after its forward pass, chunk tokens / PrefillTokensPerS,
	// and the GPU prefills the requests in flight one at a time
	// (forward.go). 0: no model, each room's chunks are sent back to back.
	PrefillTokensPerS float64
	// LayerWise sends each chunk one layer at a time: a Send per layer
	// naming its K and V buffers (SendRequest.buffers), as an engine that
	// hands a layer over as soon as its forward ran (with the model, once
	// that layer's share of the chunk's forward pass is over).
	LayerWise bool
	// PrefixFraction is the fraction of each request's pages decode
	// already holds (SendMetadataRequest.prefix_len, rounded down): those
	// pages must stay untouched, and only the others move. The prefill
	// scheduler learns the prefix as SGLang's does, from its room's
	// RoomStatus.prefix_len once it is WaitingForInput, and stages and
	// sends only the pages after it.
	PrefixFraction float64
	Tick           time.Duration
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
	// NoClear makes both schedulers forget their rooms instead of calling
	// Clear (a scheduler-side leak): the daemons must reap them after
	// their clear linger.
	NoClear bool
	// Reuse selects how requests share room ids (ReuseNone: never).
	Reuse Reuse
	// ReuseChain is how many requests share one room id under
	// ReuseAfterClear (default 3).
	ReuseChain int
	// RelayNonce: when decode opens first, prefill opens with the nonce
	// decode drew (a router that relays it), so frames of another request
	// with the same room id cannot bind the prefill room.
	RelayNonce bool
	// CheckPages makes the sim check, whatever the faults, that no byte
	// lands in the pages of a room after it is visibly Failed (R7) nor in
	// the pages of a request whose decode side never opened.
	CheckPages bool
	// Stop, if set, ends the workload early once closed: no request starts
	// after it, those in flight run to their end. Report.Requests counts
	// the requests that started.
	Stop <-chan struct{}
	// Progress, if set, is called after each request ends.
	Progress func(done, total int)
	// SendDelay, if set, is how long prefill rank rank's scheduler waits before each of its
	// Sends (a slow rank: its forward pass or its process lags the others).
	SendDelay func(rank int) time.Duration
}

// Reuse says how requests share room ids.
type Reuse int

const (
	// ReuseNone: every request has its own room id.
	ReuseNone Reuse = iota
	// ReuseAfterClear: ReuseChain requests share a room id one after the
	// other; each opens as soon as the previous one was cleared on both
	// sides, so late frames of the previous one may still be in flight.
	ReuseAfterClear
	// ReuseConcurrent: requests come in pairs that share a room id; the
	// second opens while the first is live on both sides, so both its
	// opens must be refused (AlreadyExists) and it must touch nothing.
	ReuseConcurrent
	// ReuseRace: pairs that share a room id start at the same moment, each
	// in its own random open order.
	ReuseRace
)

// Faults mixes misbehaviour into the workload; each is a fraction of the
// requests (0..1).
type Faults struct {
	AbortPrefill float64 // the prefill scheduler aborts at a random moment
	AbortDecode  float64 // the decode scheduler aborts at a random moment
	StallDecode  float64 // the decode scheduler never sends metadata
	StallPrefill float64 // the prefill scheduler never sends the last chunk
	// AbortStages, if not empty, restricts the moments of the aborts
	// (default: every stage, uniformly).
	AbortStages []Stage
}

func (f Faults) any() bool {
	return f.AbortPrefill+f.AbortDecode+f.StallDecode+f.StallPrefill > 0
}

// Report is what a run saw.
type Report struct {
	Requests int
	// Outcomes counts rooms by "<side>:<state or reason>", e.g.
	// "decode:success", "prefill:timeout:waiting_for_input"; a request
	// whose open was refused counts once as "open_error:<grpc code>".
	// "unreachable:<code>" means the daemon did not answer (killed),
	// "not_found" that it answered but no longer knew the room
	// (restarted).
	Outcomes map[string]int
	// Faults counts the faults injected, by kind and stage.
	Faults map[string]int
	// FaultOutcomes counts outcomes by fault: "<fault> -> <side>:<outcome>".
	FaultOutcomes map[string]int
	// Verified counts rooms whose every destination byte was checked;
	// Corrupt those with a wrong byte (must be 0); LateWrites those whose
	// pages changed after Failed was visible (must be 0, R7); Crossed
	// requests whose pages changed though their decode room never opened
	// (must be 0).
	Verified, Corrupt, LateWrites, Crossed int
	// Pinned counts rooms that did not end within PinBound (must be 0).
	Pinned int
	// CleanFailed counts, by "<side>:<reason>", requests that had no
	// fault injected, opened both sides and still failed: under aborts of
	// other requests and room id reuse they must all succeed.
	CleanFailed map[string]int
	// Bytes is KV bytes moved by rooms that succeeded: what landed on every decode rank.
	Bytes int64
	// LandedPages is the page positions those bytes filled, summed over the decode ranks;
	// PrefixPages the positions they already held (prefix_len), which moved nothing.
	LandedPages, PrefixPages int64
	// SentPages and SentBytes are what the prefill schedulers handed over in their Sends
	// for those rooms, summed over the prefill ranks: page positions, and those pages'
	// bytes in every buffer a Send named (what an engine stages). A scheduler that skips
	// decode's prefix sends LandedPages at equal TP; one that sends it too, more.
	SentPages, SentBytes int64
	Elapsed              time.Duration
	// PrefillRanks and DecodeRanks are each rank's share of the rooms that succeeded,
	// indexed by rank.
	PrefillRanks, DecodeRanks []RankReport
	// LastChunkToSuccess is, per successful room, the time from the last
	// Send returning to decode reporting Success.
	LastChunkToSuccess []time.Duration
	// FirstSendToSuccess is, per successful room, the time from its first
	// Send being issued (its first page handed over) to decode reporting
	// Success.
	FirstSendToSuccess []time.Duration
	// WorstTerminal is the longest time any room took to reach a terminal
	// state on both sides.
	WorstTerminal time.Duration
	// FirstError is the first error a daemon answered a scheduler's Open,
	// SendMetadata or Send with ("" if none): what a run whose rooms all
	// failed was refused for.
	FirstError string
}

// RankReport is one TP rank's share of a run.
type RankReport struct {
	Rank int
	// Rooms counts the successful rooms this rank moved bytes for (a prefill rank that only
	// answers as a dummy counts none); Bytes is what its copies sent (prefill) or what
	// landed in its pages (decode); Pages is the page positions its scheduler handed over
	// in Sends (prefill) or that landed (decode); Corrupt counts rooms whose pages on this
	// decode rank differ from what the mapping says its sources hold.
	Rooms, Corrupt int
	Bytes, Pages   int64
}

// GBps is the rank's goodput over the run's elapsed time.
func (r RankReport) GBps(elapsed time.Duration) float64 {
	if elapsed <= 0 {
		return 0
	}
	return float64(r.Bytes) / elapsed.Seconds() / 1e9
}

// Percentile returns the p-th percentile (0..100) of LastChunkToSuccess.
func (r *Report) Percentile(p float64) time.Duration {
	return percentile(r.LastChunkToSuccess, p)
}

// FirstSendPercentile returns the p-th percentile (0..100) of
// FirstSendToSuccess.
func (r *Report) FirstSendPercentile(p float64) time.Duration {
	return percentile(r.FirstSendToSuccess, p)
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
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
	if c.DecodeDir == "" {
		c.DecodeDir = c.Dir
	}
	if c.Layout.Layers == 0 {
		c.Layout = DemoLayout()
	}
	c.PrefillTP, c.DecodeTP = max(c.PrefillTP, 1), max(c.DecodeTP, 1)
	c.workloadDefaults()
}

func (c *Config) workloadDefaults() {
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
	if c.ReuseChain == 0 {
		c.ReuseChain = 3
	}
}

// engine is one TP rank's KV memory on one side, as that rank's process maps it.
type engine struct {
	rank   int
	tl     transfer.Layout
	region *transfer.Region
	path   string
	pages  *allocator
	aux    *allocator
}

// newEngines makes one engine per rank of a TP-size side.
func newEngines(dir string, l Layout, size int) ([]*engine, error) {
	var out []*engine
	for rank := range size {
		tl, err := l.RankTransfer(rank, size)
		if err == nil {
			var e *engine
			if e, err = newEngine(dir, rank, tl); err == nil {
				out = append(out, e)
				continue
			}
		}
		for _, e := range out {
			e.close()
		}
		return nil, err
	}
	return out, nil
}

func newEngine(dir string, rank int, tl transfer.Layout) (*engine, error) {
	path, err := transfer.CreateRegionFile(dir, tl)
	if err != nil {
		return nil, err
	}
	r, err := transfer.OpenRegion(path, tl)
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	return &engine{rank: rank, tl: tl, region: r, path: path, pages: newAllocator(tl.Buffers[0].Pages()), aux: newAllocator(tl.Aux.Rows)}, nil
}

func (e *engine) close() {
	e.region.Close()
	os.Remove(e.path)
}

// dial connects to a daemon. The reconnect backoff is short: a daemon
// that restarts behind the same address must be reachable again within
// a scheduler tick or two, not after gRPC's default backoff of seconds.
func dial(target string) (*grpc.ClientConn, error) {
	if len(target) > 0 && target[0] != 'u' {
		target = "passthrough:///" + target
	}
	bc := backoff.DefaultConfig
	bc.BaseDelay, bc.MaxDelay = 20*time.Millisecond, 200*time.Millisecond
	return grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bc, MinConnectTimeout: time.Second}))
}

func layoutProto(tl transfer.Layout) *pb.RegionLayout {
	l := &pb.RegionLayout{Rank: &pb.Rank{TpRank: uint32(tl.Rank.TP), TpSize: uint32(tl.Rank.Size)},
		Aux:       &pb.AuxSpec{Offset: uint64(tl.Aux.Offset), RowLen: uint32(tl.Aux.RowLen), Rows: uint32(tl.Aux.Rows)},
		Attention: pb.Attention(tl.Attention)} // rankmap's values are the proto's
	for _, b := range tl.Buffers {
		l.Buffers = append(l.Buffers, &pb.BufferSpec{Offset: uint64(b.Offset), Length: uint64(b.Length), ItemLen: uint32(b.ItemLen),
			PageTokens: uint32(b.PageTokens), TotalHeads: uint32(b.TotalHeads), RankHeads: uint32(b.RankHeads), HeadBytes: uint32(b.HeadBytes)})
	}
	return l
}

// Sim is the two simulated engines: their KV regions, registered with the
// daemons, and the gRPC connections to them. Several workloads may run on
// one Sim, one after the other.
type Sim struct {
	cfg Config
	// plan is which prefill rank feeds which decode rank, as the daemons plan it.
	plan     rankmap.Mapping
	pre, dec []*engine // by rank
	// expectedSenders is the prefill TP size (OpenReceiverRequest.expected_senders;
	// 0 at TP 1, as before ranks).
	expectedSenders uint32
	conns           []*grpc.ClientConn
	prefill         pb.PrefillServiceClient
	decode          pb.DecodeServiceClient
	regMu           sync.Mutex

	closeOnce sync.Once
	closing   chan struct{} // closed by Close: running workloads stop
	runs      sync.WaitGroup
}

// New creates both engines' regions under cfg.Dir (decode's under
// cfg.DecodeDir if set), connects to the
// daemons and registers the regions. Close releases them.
func New(ctx context.Context, cfg Config) (*Sim, error) {
	cfg.defaults()
	s := &Sim{cfg: cfg, closing: make(chan struct{})}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	var err error
	if s.pre, err = newEngines(cfg.Dir, cfg.Layout, cfg.PrefillTP); err != nil {
		return nil, err
	}
	if s.dec, err = newEngines(cfg.DecodeDir, cfg.Layout, cfg.DecodeTP); err != nil {
		return nil, err
	}
	if s.plan, err = transfer.PlanRanks(s.pre[0].tl, s.dec[0].tl); err != nil {
		return nil, fmt.Errorf("sim: prefill tp %d -> decode tp %d: %w", cfg.PrefillTP, cfg.DecodeTP, err)
	}
	if cfg.PrefillTP > 1 || cfg.DecodeTP > 1 {
		// The prefill TP size, as SGLang's decode names it: decoded plans
		// each rank's sources from it, which the count of ranks that feed
		// (fewer, when heads are replicated or the attention is MLA) cannot
		// tell.
		s.expectedSenders = uint32(cfg.PrefillTP)
	}
	pconn, err := dial(cfg.PrefillGRPC)
	if err != nil {
		return nil, err
	}
	s.conns = append(s.conns, pconn)
	dconn, err := dial(cfg.DecodeGRPC)
	if err != nil {
		return nil, err
	}
	s.conns = append(s.conns, dconn)
	s.prefill, s.decode = pb.NewPrefillServiceClient(pconn), pb.NewDecodeServiceClient(dconn)
	if err := s.Register(ctx); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// Close stops the workloads still running, waits for them, closes the
// connections and removes the region files.
func (s *Sim) Close() {
	s.closeOnce.Do(func() { close(s.closing) })
	s.runs.Wait()
	for _, c := range s.conns {
		c.Close()
	}
	for _, e := range slices.Concat(s.pre, s.dec) {
		e.close()
	}
}

// Register registers both engines' regions with the daemons, as an
// engine does when it starts and again when its daemon restarted (a
// restarted daemon knows no region). It is idempotent.
func (s *Sim) Register(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s.regMu.Lock()
	defer s.regMu.Unlock()
	// Wait for a daemon that is (re)starting rather than fail at once.
	ready := grpc.WaitForReady(true)
	for _, e := range s.pre {
		if _, err := s.prefill.RegisterRegion(rctx, &pb.PrefillServiceRegisterRegionRequest{RegionPath: e.path, Layout: layoutProto(e.tl)}, ready); err != nil {
			return fmt.Errorf("register prefill rank %d of %d: %w", e.rank, len(s.pre), err)
		}
	}
	for _, e := range s.dec {
		if _, err := s.decode.RegisterRegion(rctx, &pb.DecodeServiceRegisterRegionRequest{RegionPath: e.path, Layout: layoutProto(e.tl)}, ready); err != nil {
			return fmt.Errorf("register decode rank %d of %d: %w", e.rank, len(s.dec), err)
		}
	}
	return nil
}

// noRegion reports whether err says the daemon has no region (it
// restarted since the engine registered).
func noRegion(err error) bool {
	return status.Code(err) == codes.FailedPrecondition && strings.Contains(status.Convert(err).Message(), "no region registered")
}

// Run drives the workload to the end and reports. It returns an error only
// when the run could not be set up; room failures are in the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	if int64((cfg.MaxTokens+cfg.Layout.PageTokens-1)/cfg.Layout.PageTokens) > cfg.Layout.Pages {
		return nil, fmt.Errorf("sim: a %d-token request does not fit %d pages", cfg.MaxTokens, cfg.Layout.Pages)
	}
	s, err := New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return s.Run(ctx, cfg)
}

// Run drives one workload on the sim's engines and daemons: the workload
// fields of w (Requests through Progress) are used, its addresses, Dir and
// Layout are the sim's. Runs must not overlap.
func (s *Sim) Run(ctx context.Context, w Config) (*Report, error) {
	s.runs.Add(1)
	defer s.runs.Done()
	select {
	case <-s.closing:
		return nil, fmt.Errorf("sim: closed")
	default:
	}
	cfg := s.cfg
	cfg.Requests, cfg.MinTokens, cfg.MaxTokens, cfg.Concurrency = w.Requests, w.MinTokens, w.MaxTokens, w.Concurrency
	cfg.ChunkPages, cfg.Tick, cfg.PinBound, cfg.Seed, cfg.Faults = w.ChunkPages, w.Tick, w.PinBound, w.Seed, w.Faults
	cfg.PrefillTokensPerS, cfg.LayerWise, cfg.PrefixFraction = w.PrefillTokensPerS, w.LayerWise, w.PrefixFraction
	cfg.NoVerify = w.NoVerify
	cfg.NoClear, cfg.Reuse, cfg.ReuseChain, cfg.RelayNonce, cfg.CheckPages = w.NoClear, w.Reuse, w.ReuseChain, w.RelayNonce, w.CheckPages
	cfg.Progress, cfg.Stop, cfg.SendDelay = w.Progress, w.Stop, w.SendDelay
	cfg.workloadDefaults()
	if int64((cfg.MaxTokens+cfg.Layout.PageTokens-1)/cfg.Layout.PageTokens) > cfg.Layout.Pages {
		return nil, fmt.Errorf("sim: a %d-token request does not fit %d pages", cfg.MaxTokens, cfg.Layout.Pages)
	}
	r := &run{Sim: s, cfg: cfg,
		rep: &Report{Requests: cfg.Requests, Outcomes: map[string]int{}, Faults: map[string]int{}, FaultOutcomes: map[string]int{}, CleanFailed: map[string]int{},
			PrefillRanks: rankReports(len(s.pre)), DecodeRanks: rankReports(len(s.dec))},
		stop: make(chan struct{}), gpu: newGPU(cfg.PrefillTokensPerS, realClock{})}
	r.strict = cfg.CheckPages || cfg.Faults.any() || cfg.Reuse != ReuseNone

	start := time.Now()
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5DEECE66D))
	base := rng.Uint64N(1<<40) + 1
	sem := make(chan struct{}, cfg.Concurrency)
	var wg sync.WaitGroup
	var done atomic.Int64
	finished := make(chan struct{})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-ctx.Done():
		case <-s.closing:
			cancel()
		case <-finished:
		}
		r.stopOnce.Do(func() { close(r.stop) })
		for _, e := range slices.Concat(s.pre, s.dec) {
			e.pages.wakeAll()
			e.aux.wakeAll()
		}
	}()
	ended := func() {
		n := done.Add(1)
		if cfg.Progress != nil {
			cfg.Progress(int(n), cfg.Requests)
		}
	}
	// A unit is what one semaphore slot serves: one request, a chain of
	// requests sharing a room id, or a pair sharing one.
	unit := 1
	switch cfg.Reuse {
	case ReuseAfterClear:
		unit = cfg.ReuseChain
	case ReuseConcurrent, ReuseRace:
		unit = 2
	}
	started := 0
loop:
	for i := 0; i < cfg.Requests; i += unit {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			break loop
		case <-cfg.Stop:
			break loop
		}
		select {
		case <-cfg.Stop:
			<-sem
			break loop
		default:
		}
		n := min(unit, cfg.Requests-i)
		started += n
		room := base + uint64(i)
		rqs := make([]request, n)
		for j := range rqs {
			rqs[j] = r.newRequest(room, rng)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			switch {
			case cfg.Reuse == ReuseAfterClear || n == 1:
				prevFault := false
				for _, rq := range rqs {
					rq.afterFault = prevFault
					r.serve(ctx, rq)
					prevFault = rq.fault != faultNone
					ended()
				}
			default:
				r.servePair(ctx, rqs[0], rqs[1], cfg.Reuse == ReuseConcurrent)
				ended()
				ended()
			}
		}()
	}
	wg.Wait()
	close(finished)
	r.stopOnce.Do(func() { close(r.stop) })
	r.rep.Elapsed = time.Since(start)
	r.rep.Requests = started
	return r.rep, ctx.Err()
}

func rankReports(n int) []RankReport {
	out := make([]RankReport, n)
	for i := range out {
		out[i].Rank = i
	}
	return out
}

// servePair runs two requests that share a room id. Ordered: b opens
// once a opened both sides, and a goes on once b tried.
func (s *run) servePair(ctx context.Context, a, b request, ordered bool) {
	b.dup = true
	if ordered {
		aOpened, bTried := make(chan struct{}), make(chan struct{})
		a.opened, a.waitFor = aOpened, bTried
		b.opened, b.waitFor = bTried, aOpened
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); s.serve(ctx, a) }()
	go func() { defer wg.Done(); s.serve(ctx, b) }()
	wg.Wait()
}

type run struct {
	*Sim
	cfg      Config
	strict   bool // check pages of failed and unopened rooms
	stop     chan struct{}
	stopOnce sync.Once
	gpu      *gpu // the prefill engine's forward passes (nil: none)

	mu  sync.Mutex
	rep *Report
}

// refused notes a daemon's answer to a scheduler call that was an error.
func (s *run) refused(call string, rank int, err error) {
	if err == nil || s.rep == nil { // no report: a run made by a unit test
		return
	}
	s.record(func(r *Report) {
		if r.FirstError == "" {
			r.FirstError = fmt.Sprintf("%s (rank %d): %v", call, rank, err)
		}
	})
}

func (s *run) record(f func(r *Report)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f(s.rep)
}
