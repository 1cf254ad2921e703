package transfer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/rankmap"
)

// SenderConfig configures the prefill side. Zero values take the defaults.
type SenderConfig struct {
	// ConnsPerPeer is the number of data connections kept per decode peer (no daemon flag:
	// session 20 measured 1 worse and 4 no better than 2 on loopback; docs/history/room-PLAN.md section 0).
	// Default 2.
	ConnsPerPeer int
	// Checksum is --checksum: ChecksumCRC32C (default) or ChecksumNone.
	Checksum Checksum
	// MaxChunkBytes bounds one chunk's payload; a chunk holds at least one page. Default 1 MiB.
	MaxChunkBytes int64
	// MaxInflightBytes bounds, per peer, the bytes of appended chunks admitted and not yet
	// written: a piece is admitted chunk by chunk, and each chunk's bytes are given back as
	// its write returns. Chunks beyond it wait (WaitAdmitted, and Send, block on them:
	// backpressure; Stream.Admitted reports the end of the wait), closing streams' first in
	// the order they closed, then in append order, the slot holding the fewest admitted
	// bytes first; a slot's writer also writes a closing stream's admitted chunks before an
	// open stream's. A chunk larger than the bound is admitted alone. The bound is about
	// the backlog a last Send's final chunk, once admitted, can still wait behind: 256 MiB
	// admitted by whole pieces made last chunk -> Success 140-180 ms at the bench's 2-3
	// GB/s, 64 MiB 22-30 ms; admitted by chunks, 16 MiB gives 8-10 ms and keeps both
	// connections fed (docs/history/room-PLAN.md section 0, session 20). Default 16 MiB.
	MaxInflightBytes int64
	// DialTimeout bounds a dial plus the Authenticator preface. Default 5s.
	DialTimeout time.Duration
	// ShmOfferTimeout is the base of the wait for decode's answer to a SHM_OFFER; the wait
	// grows with the offered file's size (shmOfferWait: a decoded of the previous build
	// maps it with MAP_POPULATE before it answers; this one answers at once and pre-faults
	// in the background). The connection's writer waits meanwhile, holding every stream
	// pinned to it, so a decode that accepted the connection and never answers costs this,
	// then the connection breaks and is redialed. Default 1s.
	ShmOfferTimeout time.Duration
	// IdleTimeout breaks a connection whose receiver does not answer a ping within it.
	// Default 10s; keep it equal to the receiver's.
	IdleTimeout time.Duration
	// KeepAlive is how long a connection may go without a write before a ping. Default
	// IdleTimeout/3.
	KeepAlive time.Duration
	// WriteTimeout is the base deadline of every write; MinWriteRate (bytes/s) scales it by
	// size: deadline = WriteTimeout + bytes/MinWriteRate. Defaults 5s and 64 MiB/s.
	WriteTimeout time.Duration
	MinWriteRate int64
	// RedialMin and RedialMax bound the redial backoff. Defaults 50ms and 5s.
	RedialMin, RedialMax time.Duration
	// FenceGrace is how long a Fence that returned false lets the write in progress for the
	// room finish before it interrupts it (the connection's write deadline is set to now, so
	// that connection breaks). Default 500ms.
	FenceGrace time.Duration
	// OnFenced, if set, is called once for a room whose Fence returned false, when the last
	// worker reading its source pages lets go. It runs on a transfer goroutine, under no
	// transfer lock, and must not block.
	OnFenced func(Key)
	// Dialer defaults to a *net.Dialer.
	Dialer Dialer
	// Auth runs the connection preface before any chunk. Default NoAuth.
	Auth Authenticator
	// Logger defaults to zap.NewNop().
	Logger *zap.Logger
	// Transport is --data-transport: KindTCP (default here) sends every page as payload;
	// KindAuto offers each rank's region to the peer and copies nothing itself where the
	// peer proved it (TCP where it did not); KindShm fails a stream the peer refused.
	Transport Kind
}

func (c *SenderConfig) setDefaults() error {
	var err error
	if c.Checksum, err = ParseChecksum(string(c.Checksum)); err != nil {
		return err
	}
	def := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	if c.ConnsPerPeer == 0 {
		c.ConnsPerPeer = 2
	}
	if c.MaxChunkBytes == 0 {
		c.MaxChunkBytes = 1 << 20
	}
	if c.MaxInflightBytes == 0 {
		c.MaxInflightBytes = 16 << 20
	}
	if c.MinWriteRate == 0 {
		c.MinWriteRate = 64 << 20
	}
	def(&c.DialTimeout, 5*time.Second)
	def(&c.ShmOfferTimeout, time.Second)
	def(&c.IdleTimeout, 10*time.Second)
	def(&c.KeepAlive, c.IdleTimeout/3)
	def(&c.WriteTimeout, 5*time.Second)
	def(&c.RedialMin, 50*time.Millisecond)
	def(&c.RedialMax, 5*time.Second)
	def(&c.FenceGrace, 500*time.Millisecond)
	if c.ConnsPerPeer < 1 || c.ConnsPerPeer > 64 || c.MaxChunkBytes < 1 || c.MaxChunkBytes > maxChunkPayload ||
		c.MaxInflightBytes < 1 || c.MinWriteRate < 1 || c.DialTimeout < 0 || c.ShmOfferTimeout < 0 || c.IdleTimeout < 0 ||
		c.KeepAlive <= 0 || c.KeepAlive >= c.IdleTimeout || c.WriteTimeout < 0 || c.RedialMin <= 0 || c.RedialMax < c.RedialMin ||
		c.FenceGrace <= 0 {
		return fmt.Errorf("%w: sender config out of range", ErrBadConfig)
	}
	if c.Dialer == nil {
		c.Dialer = &net.Dialer{}
	}
	if c.Auth == nil {
		c.Auth = NoAuth{}
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Transport == "" {
		c.Transport = KindTCP
	}
	return nil
}

// SendRequest is one room's transfer in one call: Send opens its stream and appends all of
// its pages as the last piece. Src and Dst have one page list per buffer (SamePages builds
// them when every buffer uses the same pages); the k-th source page of a buffer goes to its
// k-th destination page. Aux is the aux row (the layout's RowLen bytes, or empty when the
// room has none); it is copied.
type SendRequest struct {
	Peer     string
	Key      Key
	Src, Dst [][]Run
	Aux      []byte
	// Done is as Stream.Done.
	Done func(err error)
	// Copies is as Stream.Copies (nil: whole pages).
	Copies []rankmap.Copy
}

// Stream is one rank's share of a room, opened once decode's destination pages are known
// and filled by Append as the engine produces pages, so its bytes go on the wire while the
// engine still computes the rest.
type Stream struct {
	Peer string
	// Key is the destination's: the receiver's expectation, its rank the decode rank's.
	Key Key
	// Source is the local rank whose region the pages are read from; the zero Rank means
	// Key.Rank (equal TP: prefill rank i feeds decode rank i).
	Source Rank
	// Dst has one page list per buffer, in position order: a buffer's k-th appended source
	// page goes to its k-th destination page.
	Dst [][]Run
	// Done is called exactly once, from a sender goroutine, after no worker reads the
	// stream's source pages any more: with nil once the receiver confirmed every page and
	// the aux row (I8), or with an *Error carrying a Reason. It is not called once
	// Fence(Key) was called. It must not block.
	Done func(err error)
	// Progress, if set, is called on the stream's writer after each chunk's write
	// returned, with the chunk's payload bytes: the bytes are on their way, not confirmed
	// (Done says that). It lets the driver see a stream move while its last piece waits
	// behind other streams or a slow link. It must not block.
	Progress func(bytes int64)
	// Admitted, if set, is called once, when the stream's last piece is admitted whole into
	// the peer's in-flight budget (every earlier piece is, too): the event form of
	// WaitAdmitted, so that no caller has to wait inside the Sender for it. It runs on the
	// goroutine whose Append or write made room (the Append caller's when the budget had
	// it), under no transfer lock, and must not block. A stream fenced before may not see
	// it.
	Admitted func()
	// Copies, for MHA between different TP sizes, are the head slices the stream carries
	// (rankmap's Mapping.CopiesFrom(this prefill rank, the decode rank)): each page then
	// ships only those heads of each token, and the receiver must expect the same Copies.
	// Nil is whole pages.
	Copies []rankmap.Copy
}

// Piece is the next page positions of a stream: Src has one page list per buffer, the
// source pages of that buffer's next positions (a buffer may have none in a piece).
type Piece struct {
	Src [][]Run
	// Last closes the stream: after it every destination page of every buffer has its
	// source, and DONE with Aux (the aux row, copied; empty when the room has none) follows
	// the stream's chunks.
	Last bool
	Aux  []byte
}

// Sender is the prefill-side Transport over stream connections (TCP, or MemNetwork pipes).
type Sender struct {
	regions RegionSet
	cfg     SenderConfig
	log     *zap.Logger

	mu     sync.Mutex
	peers  map[string]*peer
	jobs   map[Key]*job // open streams, by the key their frames carry (rank included)
	closed bool
	wg     sync.WaitGroup

	interrupts atomic.Uint64
	shm        shmCounters
	// beforeTouch, for tests, runs before each checksum pass over source pages and each write.
	beforeTouch func()
	// afterArm, for tests, runs after acquireWrite armed a chunk's write, before the write:
	// where a fence's interrupt may land.
	afterArm func(Key)
}

// SenderStats counts the sender's fence interventions.
type SenderStats struct {
	StalledInterrupts uint64 // writes interrupted because a fenced room's worker held on past FenceGrace
}

// Stats returns the sender's counters.
func (s *Sender) Stats() SenderStats { return SenderStats{StalledInterrupts: s.interrupts.Load()} }

var _ Transport = (*Sender)(nil)

// NewSender returns a Sender reading from regions: each stream from its key's rank's region
// (a *Region serves every rank).
func NewSender(regions RegionSet, cfg SenderConfig) (*Sender, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Sender{regions: regions, cfg: cfg, log: cfg.Logger, peers: make(map[string]*peer), jobs: make(map[Key]*job)}, nil
}

// AddPeer registers a decode peer's data address and region layout and starts its
// connection pool. Adding a known address with the same layout is a no-op.
func (s *Sender) AddPeer(addr string, layout Layout) error {
	s.mu.Lock()
	p, known := s.peers[addr]
	s.mu.Unlock()
	if known && sameLayout(p.layout, layout) {
		return nil // checked when it was added; the daemons add the peer at every bind
	}
	if err := s.regions.Shape().Compatible(layout); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if p, ok := s.peers[addr]; ok {
		// The layout of a live peer is immutable; a restarted peer is removed and re-added.
		return p.layout.Compatible(layout)
	}
	p = newPeer(s, addr, layout, s.cfg.ConnsPerPeer)
	s.peers[addr] = p
	for i := 0; i < s.cfg.ConnsPerPeer; i++ {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			p.runSlot(i)
		}()
	}
	s.log.Info("data peer added", zap.String("peer", addr), zap.Int("conns", s.cfg.ConnsPerPeer))
	return nil
}

func sameLayout(a, b Layout) bool { return a.Equal(b) }

// RemovePeer stops the peer's connections; its open and unfinished streams fail with
// transfer_error.
func (s *Sender) RemovePeer(addr string) {
	s.mu.Lock()
	p := s.peers[addr]
	delete(s.peers, addr)
	s.mu.Unlock()
	if p != nil {
		p.close(ErrUnknownPeer)
	}
}

// Send is Open, Append of every page as the last piece, and WaitAdmitted: it blocks while
// the peer's in-flight budget is used up, until ctx ends or the room is fenced (ErrFenced,
// with reason fenced: the fence's caller knows why the room ended). A Send that returns an
// error charged nothing and its Done will not run.
func (s *Sender) Send(ctx context.Context, req SendRequest) error {
	if err := s.Open(Stream{Peer: req.Peer, Key: req.Key, Dst: req.Dst, Done: req.Done, Copies: req.Copies}); err != nil {
		return err
	}
	err := s.Append(req.Key, Piece{Src: req.Src, Last: true, Aux: req.Aux})
	if err == nil {
		err = s.WaitAdmitted(ctx, req.Key)
	}
	if err != nil && !errors.Is(err, ErrFenced) {
		s.fence(req.Key) // withdrawn: no worker started on it, and Done must not run
	}
	return err
}

// Open registers a stream and pins it to one of the peer's connection slots (the one with
// the fewest open streams), so its chunks and DONE stay in order on one connection. It
// checks the stream's shape; the destination pages are the receiver's to check: it refuses
// a chunk naming a page outside its region or its room's destination before writing a byte,
// and the room fails with reason invalid. Nothing is sent before Append.
func (s *Sender) Open(st Stream) error {
	src := st.Source
	if src == (Rank{}) {
		src = st.Key.Rank
	}
	if f := st.Key.From; f.Size > maxFromSize || (f.Size == 0 && f.TP != 0) || (f.Size != 0 && f.TP >= f.Size) {
		return fmt.Errorf("%w: from rank %d of %d", ErrBadSlice, f.TP, f.Size)
	}
	region := s.regions.ForRank(src)
	if region == nil {
		return fail(ReasonInvalid, fmt.Errorf("%w: %v", ErrNoRankRegion, st.Key))
	}
	local := region.Layout()
	if len(st.Dst) != len(local.Buffers) {
		return fmt.Errorf("%w: %d destination page lists for %d buffers", ErrRunsMismatch, len(st.Dst), len(local.Buffers))
	}
	j := &job{s: s, region: region, st: st, dst: st.Dst, dstPages: make([]int64, len(st.Dst)), next: make([]int64, len(st.Dst)),
		fenceCh: make(chan struct{})}
	for b, runs := range st.Dst {
		j.dstPages[b] = CountPages(runs)
		j.pages += j.dstPages[b]
	}
	if len(st.Copies) > 0 {
		var err error
		if j.copies, err = copiesByBuffer(st.Copies, local, false); err != nil {
			return err
		}
	}
	if n := j.pairs(); n > 1<<32-1 {
		return fmt.Errorf("%w: %d pages in one room", ErrFrameTooLarge, n)
	}
	s.mu.Lock()
	p := s.peers[st.Peer]
	switch _, dup := s.jobs[st.Key]; {
	case s.closed:
		s.mu.Unlock()
		return ErrClosed
	case p == nil:
		s.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrUnknownPeer, st.Peer)
	case dup:
		s.mu.Unlock()
		return fmt.Errorf("%w: %v", ErrDuplicateRoom, st.Key)
	}
	j.peer = p
	s.jobs[st.Key] = j
	s.mu.Unlock()
	if !p.open(j) {
		j.finalize(nil, false)
		return ErrClosed
	}
	return nil
}

// Append checks a piece against the local region and the stream's destination (the next
// positions of each buffer, the last piece covering all of them), pairs its runs, plans its
// chunks and queues it without waiting: its chunks are admitted into the peer's in-flight
// budget after the stream's earlier pieces' (closing streams first, see
// SenderConfig.MaxInflightBytes), and each chunk's bytes are given back as its write
// returns, so a stream larger than the budget never waits on its own earlier pieces. Nothing of a piece that fails these
// checks is sent, and the stream stays as it was. Append of a fenced stream fails with
// ErrFenced, of an ended one with ErrStreamEnded.
func (s *Sender) Append(key Key, pc Piece) error {
	s.mu.Lock()
	j := s.jobs[key]
	s.mu.Unlock()
	if j == nil {
		return fmt.Errorf("%w: %v", ErrStreamEnded, key)
	}
	local := j.region.Layout()
	if len(pc.Src) != len(local.Buffers) {
		return fmt.Errorf("%w: %d source page lists for %d buffers", ErrRunsMismatch, len(pc.Src), len(local.Buffers))
	}
	if n := len(pc.Aux); n != 0 && (!pc.Last || int64(n) != j.peer.layout.Aux.RowLen) {
		return fmt.Errorf("%w: aux row of %d bytes (last %v), peer rows are %d", ErrAuxMismatch, n, pc.Last, j.peer.layout.Aux.RowLen)
	}
	aux, err := copyRegionBytes(j.region, s.log, pc.Aux) // the daemon's aux row is region memory
	if err != nil {
		return fail(ReasonTransferError, err)
	}
	w := &piece{j: j, last: pc.Last, aux: aux, segs: make([][]Segment, len(pc.Src))}
	counts := make([]int64, len(pc.Src))
	j.mu.Lock()
	switch {
	case j.fenced:
		j.mu.Unlock()
		return fail(ReasonFenced, ErrFenced)
	case j.stopped || j.closed:
		j.mu.Unlock()
		return fmt.Errorf("%w: %v", ErrStreamEnded, key)
	}
	for b, src := range pc.Src {
		if b > 0 && samePageList(src, pc.Src[b-1]) && samePageList(j.dst[b], j.dst[b-1]) && j.next[b] == j.next[b-1] &&
			j.dstPages[b] == j.dstPages[b-1] && local.Buffers[b].Pages() == local.Buffers[b-1].Pages() {
			// SamePages on both sides: the previous buffer's checks and segments hold
			// (segments are read-only once paired).
			w.segs[b], counts[b] = w.segs[b-1], counts[b-1]
		} else {
			if err := ValidateRuns(src, local.Buffers[b].Pages()); err != nil {
				j.mu.Unlock()
				return fmt.Errorf("buffer %d source: %w", b, err)
			}
			n := CountPages(src)
			if j.next[b]+n > j.dstPages[b] || pc.Last && j.next[b]+n != j.dstPages[b] {
				j.mu.Unlock()
				return fmt.Errorf("%w: buffer %d: %d source pages after position %d, %d destination pages (last %v)",
					ErrRunsMismatch, b, n, j.next[b], j.dstPages[b], pc.Last)
			}
			segs, err := Pair(src, runsAt(j.dst[b], j.next[b], n))
			if err != nil {
				j.mu.Unlock()
				return fmt.Errorf("buffer %d: %w", b, err)
			}
			w.segs[b], counts[b] = segs, n
		}
		w.pages += counts[b]
	}
	for b, n := range counts {
		j.next[b] += n
	}
	j.closed = pc.Last
	j.mu.Unlock()
	if w.pages == 0 && !w.last {
		return nil
	}
	if !w.plan(s) {
		// The region was replaced since the checks above: the room is fenced before
		// the old mapping goes, and nothing of the piece may be read.
		return fail(ReasonFenced, ErrFenced)
	}
	return j.peer.append(w)
}

// WaitAdmitted waits until every piece appended to the stream so far is admitted into the
// peer's in-flight budget (backpressure for a caller that wants it), until ctx ends, the
// stream is fenced (ErrFenced) or the peer closes (ErrClosed). A stream that ended is
// admitted.
func (s *Sender) WaitAdmitted(ctx context.Context, key Key) error {
	s.mu.Lock()
	j := s.jobs[key]
	s.mu.Unlock()
	if j == nil {
		return nil
	}
	p := j.peer
	for {
		p.mu.Lock()
		waiting, closed, ch := j.unadmitted > 0, p.closed, p.admitted
		p.mu.Unlock()
		switch {
		case closed:
			return ErrClosed
		case !waiting:
			return nil
		}
		select {
		case <-ctx.Done():
			p.mu.Lock()
			waiting = j.unadmitted > 0
			p.mu.Unlock()
			if !waiting {
				return nil
			}
			return ctx.Err()
		case <-p.done:
			return ErrClosed
		case <-j.fenceCh:
			return fail(ReasonFenced, ErrFenced)
		case <-ch:
		}
	}
}

// runsAt returns the n page positions of runs starting at position from.
func runsAt(runs []Run, from, n int64) []Run {
	var out []Run
	for _, r := range runs {
		if n == 0 {
			break
		}
		if from >= int64(r.Count) {
			from -= int64(r.Count)
			continue
		}
		k := min(int64(r.Count)-from, n)
		out = append(out, Run{Start: r.Start + int32(from), Count: int32(k)})
		from, n = 0, n-k
	}
	return out
}

// Fence stops the room and returns at once: no worker starts reading its source pages
// again, its queued work and budget are dropped, a Send of it waiting for admission returns
// ErrFenced, and its Done callback will not run (if Done is running, Fence returns after it).
// done is true when no worker reads the room's pages now (I9). Otherwise the worker that lets
// go calls OnFenced(key); a write still in progress after FenceGrace is interrupted, which
// breaks its connection, so every fence completes within FenceGrace plus one chunk write.
// Repeating a pending Fence returns false and changes nothing. Unknown keys are done.
func (s *Sender) Fence(key Key) (done bool) {
	done, _ = s.fence(key)
	return done
}

// FenceWait fences the room and waits until no worker reads its source pages (I9).
func (s *Sender) FenceWait(key Key) {
	if done, letGo := s.fence(key); !done {
		<-letGo
	}
}

func (s *Sender) fence(key Key) (bool, <-chan struct{}) {
	s.mu.Lock()
	j := s.jobs[key]
	s.mu.Unlock()
	if j == nil {
		return true, nil
	}
	j.mu.Lock()
	if !j.fenced {
		j.fenced, j.stopped = true, true
		close(j.fenceCh)
	}
	if j.readers > 0 {
		if j.letGo == nil {
			j.letGo = make(chan struct{})
			j.grace = time.AfterFunc(s.cfg.FenceGrace, j.interrupt)
		}
		letGo := j.letGo
		j.mu.Unlock()
		j.peer.dropPieces(j)
		s.log.Debug("room fenced", zap.Inline(key), zap.Bool("done", false))
		return false, letGo
	}
	j.mu.Unlock()
	j.finalize(nil, false)
	s.log.Debug("room fenced", zap.Inline(key), zap.Bool("done", true))
	return true, nil
}

// Close stops every peer; unfinished rooms fail with transfer_error. It waits for all
// goroutines.
func (s *Sender) Close() error {
	s.mu.Lock()
	s.closed = true
	peers := s.peers
	s.peers = map[string]*peer{}
	s.mu.Unlock()
	for _, p := range peers {
		p.close(ErrClosed)
	}
	s.wg.Wait()
	return nil
}

// job is one room on the sender. The fence protocol mirrors the receiver's: a worker
// increments readers under mu only while the job is not stopped, reads the source pages
// (checksum and socket write), then decrements; Fence sets stopped, and the decrement that
// reaches zero after it hands the room back (letGoFence).
type job struct {
	s *Sender
	// region is the one the stream's key's rank reads from, resolved at Open (a rank's
	// Region outlives its generations).
	region *Region
	peer   *peer // immutable once the job is in Sender.jobs
	st     Stream
	dst    [][]Run
	// dstPages and pages (their sum) are the stream's destination page counts.
	dstPages []int64
	pages    int64
	slot     int // the peer's connection slot the stream is pinned to
	// copies are Stream.Copies by buffer, nil for whole pages.
	copies [][]rankmap.Copy
	// fenceCh is closed by the first Fence; it ends a wait for admission.
	fenceCh chan struct{}
	// unadmitted counts the stream's pieces waiting for the peer's budget; closedAt is the
	// peer's count of closed streams when its last piece was appended (0 while open);
	// under peer.mu.
	unadmitted int
	closedAt   uint64
	// seq and sentPages are the stream's CHUNK sequence and the pages its chunks carried so
	// far: only the pinned slot's goroutine touches them.
	seq       uint32
	sentPages int64

	mu        sync.Mutex
	next      []int64 // per buffer: positions appended so far
	closed    bool    // the last piece was appended
	readers   int
	tc        *txConn // the connection whose writer holds the job, nil before
	stopped   bool    // fenced or failed: no further read of source pages
	fenced    bool
	writing   bool // a connection's writer holds one of the stream's pieces
	hasResult bool
	result    error
	letGo     chan struct{} // made by a Fence that found readers; closed when they let go
	grace     *time.Timer   // interrupts the stalled write of a pending fence
	once      sync.Once
	// shmUnacked counts its shm chunks written and not yet COPIED: each holds a reader.
	shmUnacked int
}

// piece is an appended Piece, paired with its destination pages and planned into chunks,
// the units the peer's budget admits it in.
type piece struct {
	j     *job
	segs  [][]Segment
	pages int64
	last  bool
	aux   []byte
	// plans are its chunks; charges[i] is chunk i's bytes in the peer's budget, the aux row
	// in the last piece's last. A last piece of no pages has one charge and no plan: its
	// DONE.
	plans   []chunkPlan
	charges []int64
	// Under peer.mu: admitted counts its chunks admitted so far (in order), left the
	// admitted bytes still held in the budget, and queued says the piece is in its slot's
	// queue or held by the slot's writer (admission queues it again otherwise).
	admitted int
	left     int64
	queued   bool
	// written counts its chunks written so far: only its slot's writer touches it.
	written int
	// crcs[:summed] are its chunks' payload crc32c computed so far: only its writer's
	// checksum goroutine, or the writer once summing (that goroutine's exit) closed,
	// touches them.
	crcs    []uint32
	summed  int
	summing <-chan struct{}
	// fault is the checksum goroutine's fault on the pages, set before its
	// channel of sums closes (so the writer reads it after that close).
	fault error
	// shmHeld is the part of left held by shm chunks awaiting COPIED (under peer.mu): it
	// comes back with each COPIED, not when the writer lets the piece go.
	shmHeld int64
}

// plan packs the piece into chunks and charges each its bytes; false if the region's
// mapping no longer fits the piece.
func (w *piece) plan(s *Sender) bool {
	var ok bool
	if w.plans, ok = s.planChunks(w); !ok {
		return false
	}
	w.charges = make([]int64, max(len(w.plans), 1))
	for i, c := range w.plans {
		w.charges[i] = c.bytes
	}
	w.charges[len(w.charges)-1] = max(w.charges[len(w.charges)-1]+int64(len(w.aux)), 1)
	return true
}

// acquire marks a read of the source pages as started, unless the job is stopped.
func (j *job) acquire() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.stopped {
		return false
	}
	j.readers++
	return true
}

// acquireWrite is acquire for the connection writer about to write n bytes of the job: it
// also arms the write deadline under mu, so an interrupt (which sets it to now, under mu)
// can never be overwritten by the write it interrupts. That holds only if the write is
// the deadline's last arming: the caller writes with writeArmed, never with write.
func (j *job) acquireWrite(tc *txConn, n int64) bool {
	j.mu.Lock()
	if j.stopped {
		j.mu.Unlock()
		return false
	}
	j.readers++
	j.tc = tc
	tc.armWrite(n)
	j.mu.Unlock()
	if h := j.s.afterArm; h != nil {
		h(j.st.Key)
	}
	return true
}

// release ends a read of the source pages. The last reader to let go may be the checksum
// goroutine, after the writer gave the job up and its outcome was recorded: then it
// finalizes the job, as finish and setWriting would have had the read been over.
func (j *job) release() {
	j.mu.Lock()
	j.readers--
	letGo := j.readers == 0 && j.letGo != nil && j.grace != nil
	if letGo {
		j.grace.Stop()
		j.grace = nil // marks the pending fence as handed back
	}
	ready := j.readers == 0 && !j.writing && j.hasResult
	res := j.result
	j.mu.Unlock()
	switch {
	case letGo:
		j.letGoFence()
	case ready:
		j.finalize(res, true)
	}
}

// letGoFence completes a pending fence on the worker that let go: the budget and key are
// freed first, so a FenceWait caller or OnFenced may reuse the key at once.
func (j *job) letGoFence() {
	j.finalize(nil, false)
	close(j.letGo)
	j.s.log.Debug("fenced room let go", zap.Inline(j.st.Key))
	if f := j.s.cfg.OnFenced; f != nil {
		f(j.st.Key)
	}
}

// interrupt runs FenceGrace after a fence that found a worker in the room's pages: if the
// worker still holds them, the write in progress is made to fail now.
func (j *job) interrupt() {
	j.mu.Lock()
	stalled := j.grace != nil && j.readers > 0 && j.tc != nil
	if stalled { // counted first, so whoever sees the fence end sees the count
		j.s.interrupts.Add(1)
		j.tc.conn.SetWriteDeadline(time.Now())
		if j.shmUnacked > 0 {
			// Decode still copies (or stalls on) announced pages: only the connection's
			// end frees them (its COPIED may never come).
			j.tc.conn.Close()
		}
	}
	j.mu.Unlock()
	if stalled {
		j.s.log.Warn("stalled io interrupted", zap.Inline(j.st.Key), zap.String("peer", j.st.Peer),
			zap.Duration("grace", j.s.cfg.FenceGrace))
	}
}

// finish records the room's outcome (first one wins) and finalizes once the writer has let
// go of the job.
func (j *job) finish(err error) {
	j.mu.Lock()
	if !j.hasResult {
		j.hasResult, j.result = true, err
		if err != nil {
			j.stopped = true
		}
	}
	ready := !j.writing && j.readers == 0
	res := j.result
	j.mu.Unlock()
	if ready {
		j.finalize(res, true)
	}
}

// setWriting records whether a writer holds the job; letting go may finalize it.
func (j *job) setWriting(w bool) {
	j.mu.Lock()
	j.writing = w
	ready := !w && j.hasResult
	res := j.result
	j.mu.Unlock()
	if ready {
		j.finalize(res, true)
	}
}

// finalize runs once: it returns the budget, forgets the job and, unless fenced, calls Done.
func (j *job) finalize(err error, callDone bool) {
	j.once.Do(func() {
		j.s.mu.Lock()
		if j.s.jobs[j.st.Key] == j {
			delete(j.s.jobs, j.st.Key)
		}
		j.s.mu.Unlock()
		j.mu.Lock()
		callDone = callDone && !j.fenced
		j.mu.Unlock()
		j.peer.forget(j)
		if !callDone {
			return
		}
		if err != nil {
			fields := []zap.Field{zap.Inline(j.st.Key), zap.String("peer", j.st.Peer),
				zap.String("reason", string(ReasonOf(err)))}
			if re := (*ResultError)(nil); errors.As(err, &re) {
				fields = append(fields, zap.Uint32("result_code", re.Code)) // decode said so
			}
			j.s.log.Warn("room transfer failed", append(fields, zap.Error(err))...)
		}
		if j.st.Done != nil {
			j.st.Done(err)
		}
	})
}
