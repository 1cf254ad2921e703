package transfer

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// SenderConfig configures the prefill side. Zero values take the defaults.
type SenderConfig struct {
	// ConnsPerPeer is the number of data connections kept per decode peer (--data-conns).
	// Default 2.
	ConnsPerPeer int
	// Checksum is --checksum: ChecksumCRC32C (default) or ChecksumNone.
	Checksum Checksum
	// MaxChunkBytes bounds one chunk's payload; a chunk holds at least one page. Default 1 MiB.
	MaxChunkBytes int64
	// MaxInflightBytes bounds the bytes of rooms accepted by Send and not yet finished, per
	// peer; Send blocks beyond it (backpressure). A room larger than the bound is admitted
	// alone. Default 256 MiB.
	MaxInflightBytes int64
	// DialTimeout bounds a dial plus the Authenticator preface. Default 5s.
	DialTimeout time.Duration
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
		c.MaxInflightBytes = 256 << 20
	}
	if c.MinWriteRate == 0 {
		c.MinWriteRate = 64 << 20
	}
	def(&c.DialTimeout, 5*time.Second)
	def(&c.IdleTimeout, 10*time.Second)
	def(&c.KeepAlive, c.IdleTimeout/3)
	def(&c.WriteTimeout, 5*time.Second)
	def(&c.RedialMin, 50*time.Millisecond)
	def(&c.RedialMax, 5*time.Second)
	def(&c.FenceGrace, 500*time.Millisecond)
	if c.ConnsPerPeer < 1 || c.ConnsPerPeer > 64 || c.MaxChunkBytes < 1 || c.MaxChunkBytes > maxChunkPayload ||
		c.MaxInflightBytes < 1 || c.MinWriteRate < 1 || c.DialTimeout < 0 || c.IdleTimeout < 0 ||
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
	return nil
}

// SendRequest is one room's transfer. Src and Dst have one page list per buffer (SamePages
// builds them when every buffer uses the same pages); the k-th source page of a buffer goes
// to its k-th destination page. Aux is the aux row (the layout's RowLen bytes, or empty when
// the room has none); it is copied.
type SendRequest struct {
	Peer     string
	Key      Key
	Src, Dst [][]Run
	Aux      []byte
	// Done is called exactly once, from a sender goroutine, after no worker reads the
	// room's source pages any more: with nil once the receiver confirmed every page and
	// the aux row (I8), or with an *Error carrying a Reason. It is not called once
	// Fence(Key) was called. It must not block.
	Done func(err error)
}

// Sender is the prefill-side Transport over stream connections (TCP, or MemNetwork pipes).
type Sender struct {
	region *Region
	cfg    SenderConfig
	log    *zap.Logger

	mu     sync.Mutex
	peers  map[string]*peer
	jobs   map[Key]*job
	closed bool
	wg     sync.WaitGroup

	interrupts atomic.Uint64
}

// SenderStats counts the sender's fence interventions.
type SenderStats struct {
	StalledInterrupts uint64 // writes interrupted because a fenced room's worker held on past FenceGrace
}

// Stats returns the sender's counters.
func (s *Sender) Stats() SenderStats { return SenderStats{StalledInterrupts: s.interrupts.Load()} }

var _ Transport = (*Sender)(nil)

// NewSender returns a Sender reading from region.
func NewSender(region *Region, cfg SenderConfig) (*Sender, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	return &Sender{region: region, cfg: cfg, log: cfg.Logger, peers: make(map[string]*peer), jobs: make(map[Key]*job)}, nil
}

// AddPeer registers a decode peer's data address and region layout and starts its
// connection pool. Adding a known address with the same layout is a no-op.
func (s *Sender) AddPeer(addr string, layout Layout) error {
	if err := s.region.Layout().Compatible(layout); err != nil {
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
	p := newPeer(s, addr, layout)
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

// RemovePeer stops the peer's connections; its queued and unfinished rooms fail with
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

// Send checks req's shape and its source pages against the local region (the pages it will
// read), pairs and coalesces its page runs and queues it on the peer. It blocks while the
// peer's in-flight budget is used up, until ctx ends or the room is fenced (ErrFenced, with
// reason fenced: the fence's caller knows why the room ended); a Send that returns an error
// charged nothing. Nothing is read or sent for a request that
// fails these checks. The destination pages are the receiver's to check: it refuses a chunk
// naming a page outside its region or its room's destination before writing a byte, and the
// room fails with reason invalid.
func (s *Sender) Send(ctx context.Context, req SendRequest) error {
	s.mu.Lock()
	p := s.peers[req.Peer]
	closed := s.closed
	_, dup := s.jobs[req.Key]
	s.mu.Unlock()
	switch {
	case closed:
		return ErrClosed
	case p == nil:
		return fmt.Errorf("%w: %s", ErrUnknownPeer, req.Peer)
	case dup:
		return fmt.Errorf("%w: %v", ErrDuplicateRoom, req.Key)
	}
	j, err := s.plan(req, p.layout)
	if err != nil {
		return err
	}
	j.peer = p
	// The job is known before it waits for admission, so a Fence of its key finds it and
	// ends the wait.
	s.mu.Lock()
	if _, dup := s.jobs[req.Key]; dup || s.closed {
		s.mu.Unlock()
		if dup {
			return fmt.Errorf("%w: %v", ErrDuplicateRoom, req.Key)
		}
		return ErrClosed
	}
	s.jobs[req.Key] = j
	s.mu.Unlock()
	if err := p.acquire(ctx, j.charge, j.fenceCh); err != nil {
		j.finalize(nil, false)
		return err
	}
	j.mu.Lock()
	fenced := j.fenced
	j.admitted = !fenced
	j.mu.Unlock()
	if fenced { // fenced between admission and here: the fence did not see the charge
		p.release(j.charge)
		return fail(ReasonFenced, ErrFenced)
	}
	if !p.enqueue(j) {
		j.finish(fail(ReasonTransferError, ErrUnknownPeer))
	}
	return nil
}

// plan validates a request and computes its segments.
func (s *Sender) plan(req SendRequest, peerLayout Layout) (*job, error) {
	local := s.region.Layout()
	if len(req.Src) != len(local.Buffers) || len(req.Dst) != len(local.Buffers) {
		return nil, fmt.Errorf("%w: %d source and %d destination page lists for %d buffers",
			ErrRunsMismatch, len(req.Src), len(req.Dst), len(local.Buffers))
	}
	if n := len(req.Aux); n != 0 && int64(n) != peerLayout.Aux.RowLen {
		return nil, fmt.Errorf("%w: aux row of %d bytes, peer rows are %d", ErrAuxMismatch, n, peerLayout.Aux.RowLen)
	}
	j := &job{s: s, req: req, aux: append([]byte(nil), req.Aux...), segs: make([][]Segment, len(req.Src)),
		fenceCh: make(chan struct{})}
	for i := range req.Src {
		if err := ValidateRuns(req.Src[i], local.Buffers[i].Pages()); err != nil {
			return nil, fmt.Errorf("buffer %d source: %w", i, err)
		}
		segs, err := Pair(req.Src[i], req.Dst[i])
		if err != nil {
			return nil, fmt.Errorf("buffer %d: %w", i, err)
		}
		j.segs[i] = segs
		n := CountPages(req.Src[i])
		j.pages += n
		j.charge += n * local.Buffers[i].ItemLen
	}
	if j.pages > 1<<32-1 {
		return nil, fmt.Errorf("%w: %d pages in one room", ErrFrameTooLarge, j.pages)
	}
	j.charge = max(j.charge+int64(len(j.aux)), 1)
	return j, nil
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
		s.log.Debug("room fenced", zap.Stringer("room", key), zap.Bool("done", false))
		return false, letGo
	}
	j.mu.Unlock()
	j.peer.drop(j)
	j.finalize(nil, false)
	s.log.Debug("room fenced", zap.Stringer("room", key), zap.Bool("done", true))
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
	s      *Sender
	peer   *peer // immutable once the job is in Sender.jobs
	req    SendRequest
	aux    []byte
	segs   [][]Segment
	pages  int64
	charge int64
	// fenceCh is closed by the first Fence; it ends a wait for admission.
	fenceCh chan struct{}

	mu        sync.Mutex
	readers   int
	tc        *txConn // the connection whose writer holds the job, nil before
	stopped   bool    // fenced or failed: no further read of source pages
	fenced    bool
	admitted  bool // charge is held in peer.inflight
	writing   bool // a connection's writer holds the job
	hasResult bool
	result    error
	letGo     chan struct{} // made by a Fence that found readers; closed when they let go
	grace     *time.Timer   // interrupts the stalled write of a pending fence
	once      sync.Once
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
// can never be overwritten by the write it interrupts.
func (j *job) acquireWrite(tc *txConn, n int64) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.stopped {
		return false
	}
	j.readers++
	j.tc = tc
	tc.armWrite(n)
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
	j.s.log.Debug("fenced room let go", zap.Stringer("room", j.req.Key))
	if f := j.s.cfg.OnFenced; f != nil {
		f(j.req.Key)
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
	}
	j.mu.Unlock()
	if stalled {
		j.s.log.Warn("stalled io interrupted", zap.Stringer("room", j.req.Key), zap.String("peer", j.req.Peer),
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
		if j.s.jobs[j.req.Key] == j {
			delete(j.s.jobs, j.req.Key)
		}
		j.s.mu.Unlock()
		j.mu.Lock()
		charged := j.admitted
		j.admitted = false
		callDone = callDone && !j.fenced
		j.mu.Unlock()
		if charged {
			j.peer.release(j.charge)
		}
		if !callDone {
			return
		}
		if err != nil {
			j.s.log.Warn("room transfer failed", zap.Stringer("room", j.req.Key), zap.String("peer", j.req.Peer), zap.Error(err))
		}
		if j.req.Done != nil {
			j.req.Done(err)
		}
	})
}
