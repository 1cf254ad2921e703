package transfer

import (
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/loglimit"
	"github.com/pdlink/pdlink/pkg/rankmap"
)

// ReceiverConfig configures the decode side. Zero values take the defaults.
type ReceiverConfig struct {
	// Checksum: ChecksumCRC32C (default) requires a payload crc32c on every chunk and aux
	// row; ChecksumNone accepts frames with or without one and verifies it when present.
	Checksum Checksum
	// IdleTimeout closes a connection that delivers no byte for this long, including one
	// stalled mid-chunk (transfer-idle deadline). Senders ping well within it. Default 10s.
	IdleTimeout time.Duration
	// WriteTimeout bounds writing a result or pong. Default 5s.
	WriteTimeout time.Duration
	// HandshakeTimeout bounds the Authenticator preface. Default 10s.
	HandshakeTimeout time.Duration
	// PieceBytes is the most bytes read into a room's pages between two fence checks, so
	// a fence waits for at most one piece. Default 256 KiB.
	PieceBytes int
	// CopyWorkers is how many goroutines copy one same-host chunk, each a contiguous part
	// of at least a piece. Default 1: on the shared 2-core test machine a second worker did
	// not raise GB/s (doc.go, "Same-host pages"); a host with a spare core per decode
	// connection may set 2.
	CopyWorkers int
	// FenceGrace is how long a Fence that returned false lets the piece in progress for the
	// room land before it interrupts the read (the connection's read deadline is set to
	// now, so that connection breaks). Default 500ms.
	FenceGrace time.Duration
	// OnFenced, if set, is called once for a room whose Fence returned false, when the last
	// write into its pages ends. It runs on the connection goroutine that wrote, under no
	// transfer lock, and must not block.
	OnFenced func(Key)
	// Auth runs before any frame is read. Default NoAuth.
	Auth Authenticator
	// Logger defaults to zap.NewNop().
	Logger *zap.Logger
	// Transport is --data-transport: KindTCP (default here) declines every same-host
	// offer; KindAuto and KindShm map a proven prefill file and copy from it.
	Transport Kind
}

// MaxCopyWorkers is the most ReceiverConfig.CopyWorkers: past the cores of any host here,
// and each worker is a goroutine per chunk being copied.
const MaxCopyWorkers = 16

func (c *ReceiverConfig) setDefaults() error {
	var err error
	if c.Checksum, err = ParseChecksum(string(c.Checksum)); err != nil {
		return err
	}
	if c.IdleTimeout == 0 {
		c.IdleTimeout = 10 * time.Second
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = 5 * time.Second
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = 10 * time.Second
	}
	if c.PieceBytes == 0 {
		c.PieceBytes = 256 << 10
	}
	if c.FenceGrace == 0 {
		c.FenceGrace = 500 * time.Millisecond
	}
	if c.CopyWorkers == 0 {
		c.CopyWorkers = 1
	}
	if c.CopyWorkers < 1 || c.CopyWorkers > MaxCopyWorkers {
		return fmt.Errorf("%w: copy_workers must be 1 to %d", ErrBadConfig, MaxCopyWorkers)
	}
	if c.IdleTimeout < 0 || c.WriteTimeout < 0 || c.HandshakeTimeout < 0 || c.PieceBytes < 4096 || c.FenceGrace <= 0 {
		return fmt.Errorf("%w: receiver timeouts and fence_grace must be positive and piece_bytes >= 4096", ErrBadConfig)
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

// Expectation is a room's destination on the decode side, from its METADATA: the pages per
// buffer (Dst has one entry per buffer of the region; an entry may be empty) and the aux row
// index (-1 for none). Bytes land only in these pages.
//
// Copies, for MHA between different TP sizes, are the head slices this stream brings
// (rankmap's Mapping.CopiesFrom(source rank, this decode rank)): each destination page of
// a buffer then takes exactly those slices, the bytes outside them are never written, and
// the room is Complete once every (page, slice) pair landed. Nil is whole pages.
type Expectation struct {
	Key    Key
	Dst    [][]Run
	AuxRow int64
	Copies []rankmap.Copy
}

// ReceiverStats counts frames that were received but not written, and fence interventions.
type ReceiverStats struct {
	DiscardedChunks   uint64 // chunks for unknown, fenced or terminal rooms, drained unread
	DiscardedBytes    uint64
	RejectedFrames    uint64 // frames that failed a room (invalid, checksum), or broke a connection: Refused's sum
	StalledInterrupts uint64 // reads interrupted because a fenced room's piece did not land within FenceGrace
}

// Receiver is the decode-side Sink over stream connections (TCP, or MemNetwork pipes). It is
// the only writer of its regions (one per TP rank the daemon serves; each room writes into
// its key's rank's).
type Receiver struct {
	regions RegionSet
	cfg     ReceiverConfig
	events  Events
	log     *zap.Logger

	mu     sync.Mutex
	rooms  map[Key]*rxRoom // by the key frames carry: each rank of a room is its own entry
	conns  map[net.Conn]struct{}
	lns    map[net.Listener]struct{}
	closed bool
	wg     sync.WaitGroup

	discardedChunks, discardedBytes, interrupts atomic.Uint64
	refused                                     [numRefusals]atomic.Uint64 // by Refusal; their sum is ReceiverStats.RejectedFrames
	refusalLog                                  *loglimit.Limiter[Refusal]
	shm                                         shmCounters
	// beforeTouch, for tests, runs before each piece is read into destination pages.
	beforeTouch func()
	// pmu guards pop, the pre-faulting of proven prefill mappings (shm_populate.go).
	pmu sync.Mutex
	pop populator
	// populate pre-faults a range of a source mapping (populateRange; tests slow it).
	populate func(m *Mapping, off, n int64) error
	// beforeCheck, for tests, runs before each stat of a prefill file a shm chunk copies from.
	beforeCheck func()
	// shmCaps is the ShmCaps an accepted offer's answer says this receiver copies
	// (shmCapsBuilt; tests answer as an older build, whichever goroutine they run on).
	shmCaps atomic.Uint32
}

var _ Sink = (*Receiver)(nil)

// NewReceiver returns a Receiver writing into regions: each room into its key's rank's
// region (a *Region serves every rank). events may be nil.
func NewReceiver(regions RegionSet, cfg ReceiverConfig, events Events) (*Receiver, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if events == nil {
		events = NopEvents{}
	}
	r := &Receiver{
		regions: regions, cfg: cfg, events: events, log: cfg.Logger,
		rooms: make(map[Key]*rxRoom), conns: make(map[net.Conn]struct{}), lns: make(map[net.Listener]struct{}),
		populate: populateRange, refusalLog: loglimit.New(numRefusals, time.Second, nil),
	}
	r.shmCaps.Store(uint32(shmCapsBuilt))
	return r, nil
}

// Stats returns the discard and reject counters.
func (r *Receiver) Stats() ReceiverStats {
	var rejected uint64
	for i := range r.refused {
		rejected += r.refused[i].Load()
	}
	return ReceiverStats{r.discardedChunks.Load(), r.discardedBytes.Load(), rejected, r.interrupts.Load()}
}

// rxBuf is one buffer's expected destination pages: sorted, coalesced runs, the position of
// each run's first page in the room's page list, and which positions were claimed.
type rxBuf struct {
	runs    []Run
	pos     []int64
	claimed []uint64 // by position; a sliced room's by position*len(slices)+slice
	slices  []rankmap.Copy
}

type outcome uint8

const (
	live outcome = iota
	completed
	failed
	fenced
)

// rxRoom is one expected room. Fields under mu; the write protocol is: a connection
// goroutine joins writing under mu only while the room is live, writes one piece without the
// lock, then leaves. Fence marks the room fenced under mu; once writing is empty no byte
// lands for the room, and the goroutine that empties it after a Fence hands the room back
// (letGoFence).
type rxRoom struct {
	key Key
	// region is the one the key's rank writes into, resolved at Expect.
	region *Region
	auxRow int64
	total  int64 // pages expected over all buffers

	mu       sync.Mutex
	writing  []*rxConn // connections reading a piece into the room's pages now
	state    outcome
	reason   Reason
	nextSeq  uint32
	claimed  int64
	verified int64
	bufs     []rxBuf
	sliced   bool          // the room takes head slices (Expectation.Copies), never whole pages
	letGo    chan struct{} // made by a Fence that found a write; closed when it ends
	grace    *time.Timer   // interrupts the stalled read of a pending fence; nil once handed back
}

// samePageList reports whether a and b are the same page list (one slice, as SamePages
// hands out), not merely equal: the cheap check that lets every buffer share one list.
func samePageList(a, b []Run) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// Expect registers a room's rank. Dst must have one entry per buffer; AuxRow must be a row
// of the region (or -1 when the region has no aux rows to fill). It fails with
// ErrDuplicateRoom if the key, rank included, is live; another rank of the same room is
// another key, and takes only the frames that name its rank. The destination pages are not
// checked here: the caller's edge checked them once (ValidateRuns), and every chunk is
// checked against the region and against Dst before a byte is written, so a page outside
// the region or named twice fails the room (reason invalid) and is never written.
func (r *Receiver) Expect(e Expectation) error {
	region := r.regions.ForRank(e.Key.Rank)
	if region == nil {
		return fmt.Errorf("%w: %v", ErrNoRankRegion, e.Key)
	}
	l := region.Layout()
	if len(e.Dst) != len(l.Buffers) {
		return fmt.Errorf("%w: %d page lists for %d buffers", ErrRunsMismatch, len(e.Dst), len(l.Buffers))
	}
	if e.AuxRow < -1 || e.AuxRow >= l.Aux.Rows {
		return fmt.Errorf("%w: row %d of %d", ErrAuxMismatch, e.AuxRow, l.Aux.Rows)
	}
	room := &rxRoom{key: e.Key, region: region, auxRow: e.AuxRow, bufs: make([]rxBuf, len(e.Dst))}
	counts := make([]int64, len(e.Dst))
	mult, err := expectSlices(room, e.Copies, l)
	if err != nil {
		return err
	}
	var words int64
	for i, runs := range e.Dst {
		if i > 0 && samePageList(runs, e.Dst[i-1]) {
			// SamePages: one sorted list serves every buffer (runs and pos are read-only).
			room.bufs[i].runs, room.bufs[i].pos, counts[i] = room.bufs[i-1].runs, room.bufs[i-1].pos, counts[i-1]
		} else {
			s := slices.Clone(runs)
			slices.SortFunc(s, func(a, b Run) int { return int(a.Start) - int(b.Start) })
			s = Coalesce(s)
			b := rxBuf{runs: s, pos: make([]int64, len(s))}
			for j, run := range s {
				b.pos[j] = counts[i]
				counts[i] += int64(run.Count)
			}
			room.bufs[i].runs, room.bufs[i].pos = b.runs, b.pos
		}
		room.total += counts[i] * mult[i]
		words += (counts[i]*mult[i] + 63) / 64
	}
	claimed := make([]uint64, words) // one allocation for every buffer's claim bits
	for i, n := range counts {
		w := (n*mult[i] + 63) / 64
		room.bufs[i].claimed, claimed = claimed[:w:w], claimed[w:]
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	if r.rooms[e.Key] != nil {
		return fmt.Errorf("%w: %v", ErrDuplicateRoom, e.Key)
	}
	r.rooms[e.Key] = room
	return nil
}

// Fence ends the room and returns at once: no later byte is written for it, even if its
// chunks are still on the wire (they are drained and discarded), and the room is forgotten.
// done is true when no write into its pages is in progress (I9). Otherwise the room stays
// known (a second Expect of the key is refused) until the connection goroutine whose piece
// is landing lets go and calls OnFenced(key); a piece still landing after FenceGrace is
// interrupted, which breaks that connection, so every fence completes within FenceGrace plus
// one piece (PieceBytes). Repeating a pending Fence returns false and changes nothing;
// unknown keys are done. Call it for every expected room when the room ends (clear, abort,
// timeout); the engine may reuse the pages once it is done.
func (r *Receiver) Fence(key Key) (done bool) {
	done, _ = r.fence(key)
	return done
}

// FenceWait fences the room and waits until no write into its pages is in progress (I9).
func (r *Receiver) FenceWait(key Key) {
	if done, letGo := r.fence(key); !done {
		<-letGo
	}
}

func (r *Receiver) fence(key Key) (bool, <-chan struct{}) {
	room := r.lookup(key)
	if room == nil {
		return true, nil
	}
	room.mu.Lock()
	if room.state == live {
		room.state = fenced
	}
	if len(room.writing) > 0 {
		if room.letGo == nil {
			room.letGo = make(chan struct{})
			room.grace = time.AfterFunc(r.cfg.FenceGrace, func() { r.interrupt(room) })
		}
		letGo := room.letGo
		room.mu.Unlock()
		r.log.Debug("room fenced", zap.Inline(key), zap.Bool("done", false))
		return false, letGo
	}
	room.mu.Unlock()
	r.forget(room)
	r.log.Debug("room fenced", zap.Inline(key), zap.Bool("done", true))
	return true, nil
}

func (r *Receiver) forget(room *rxRoom) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rooms[room.key] == room {
		delete(r.rooms, room.key)
	}
}

// letGoFence completes a pending fence on the connection goroutine that let go: the key is
// forgotten first, so a FenceWait caller or OnFenced may expect it again at once.
func (r *Receiver) letGoFence(room *rxRoom) {
	r.forget(room)
	close(room.letGo)
	r.log.Debug("fenced room let go", zap.Inline(room.key))
	if f := r.cfg.OnFenced; f != nil {
		f(room.key)
	}
}

// interrupt runs FenceGrace after a fence that found a write in the room's pages: every
// connection still reading a piece into them has its read made to fail now.
func (r *Receiver) interrupt(room *rxRoom) {
	room.mu.Lock()
	n := 0
	if room.grace != nil {
		n = len(room.writing)
	}
	if n > 0 { // counted first, so whoever sees the fence end sees the count
		r.interrupts.Add(1)
		for _, c := range room.writing {
			c.c.SetReadDeadline(time.Now())
		}
	}
	room.mu.Unlock()
	if n > 0 {
		r.log.Warn("stalled io interrupted", zap.Inline(room.key), zap.Int("conns", n),
			zap.Duration("grace", r.cfg.FenceGrace))
	}
}

func (r *Receiver) lookup(key Key) *rxRoom {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rooms[key]
}

// finish moves a live room to a terminal outcome under room.mu and reports whether it did.
func (room *rxRoom) finish(o outcome, reason Reason) bool {
	if room.state != live {
		return false
	}
	room.state, room.reason = o, reason
	return true
}

// fail moves the room to failed and reports the event if this call did it; fields add
// what the caller knows (the remote end).
func (r *Receiver) fail(room *rxRoom, reason Reason, err error, fields ...zap.Field) {
	room.mu.Lock()
	ok := room.finish(failed, reason)
	room.mu.Unlock()
	if ok {
		r.log.Warn("room failed", append(fields, zap.Inline(room.key), zap.String("reason", string(reason)), zap.Error(err))...)
		r.events.Failed(room.key, reason, err)
	}
}

// claim validates a chunk against the region and the room's metadata and reserves its
// pages, under room.mu. Nothing is written before claim succeeds, and a refused chunk
// claims nothing.
func (room *rxRoom) claim(h *Header, runs []ChunkRun, l Layout) error {
	if room.sliced {
		return fmt.Errorf("%w: whole pages for a room of head slices", ErrSliceMismatch)
	}
	if h.Seq != room.nextSeq {
		return fmt.Errorf("%w: seq %d, want %d", ErrRejected, h.Seq, room.nextSeq)
	}
	var pages, bytes uint64
	for _, run := range runs {
		if uint64(run.Buffer) >= uint64(len(l.Buffers)) || uint64(run.Buffer) >= uint64(len(room.bufs)) {
			return fmt.Errorf("%w: buffer %d of %d", ErrPageOutOfRange, run.Buffer, len(l.Buffers))
		}
		spec := l.Buffers[run.Buffer]
		if run.end() > spec.Pages() {
			return fmt.Errorf("%w: buffer %d run {start %d, count %d} past %d pages",
				ErrPageOutOfRange, run.Buffer, run.Start, run.Count, spec.Pages())
		}
		pages += uint64(run.Count)
		bytes += uint64(run.Count) * uint64(spec.ItemLen)
		if pages > uint64(h.Pages) { // stop early, so the byte sum stays far from overflow
			break
		}
	}
	if pages != uint64(h.Pages) || bytes != h.PayloadLen {
		return fmt.Errorf("%w: runs hold %d pages, %d bytes, header says %d pages, %d bytes",
			ErrRejected, pages, bytes, h.Pages, h.PayloadLen)
	}
	// Claim run by run; a page that is not the room's, or already claimed (by an earlier
	// chunk or earlier in this one), undoes what this chunk claimed.
	for k, run := range runs {
		b := &room.bufs[run.Buffer]
		p0, ok := b.position(run.Run)
		if !ok {
			room.unclaim(runs[:k])
			return fmt.Errorf("%w: buffer %d pages [%d,%d) are not the room's destination",
				ErrPageOutOfRange, run.Buffer, run.Start, run.end())
		}
		for p := p0; p < p0+int64(run.Count); p++ {
			bit := uint64(1) << (p % 64)
			if b.claimed[p/64]&bit != 0 {
				b.flip(p0, p-p0)
				room.unclaim(runs[:k])
				return fmt.Errorf("%w: buffer %d page %d sent twice", ErrRunsOverlap, run.Buffer, run.Start+int32(p-p0))
			}
			b.claimed[p/64] |= bit
		}
	}
	room.nextSeq++
	room.claimed += int64(pages)
	return nil
}

// position is the room's page-list position of run's first page, if every page of run is
// among the buffer's destination pages.
func (b *rxBuf) position(run Run) (int64, bool) {
	j, ok := slices.BinarySearchFunc(b.runs, run.Start, func(e Run, t int32) int {
		switch {
		case e.end() <= int64(t):
			return -1
		case int64(e.Start) > int64(t):
			return 1
		}
		return 0
	})
	if !ok || run.end() > b.runs[j].end() {
		return 0, false
	}
	return b.pos[j] + int64(run.Start-b.runs[j].Start), true
}

// flip toggles the claim bits of n positions from p0.
func (b *rxBuf) flip(p0, n int64) {
	for p := p0; p < p0+n; p++ {
		b.claimed[p/64] ^= uint64(1) << (p % 64)
	}
}

// unclaim gives back the pages of runs that claim reserved for a chunk it then refused.
func (room *rxRoom) unclaim(runs []ChunkRun) {
	for _, run := range runs {
		b := &room.bufs[run.Buffer]
		p0, _ := b.position(run.Run)
		b.flip(p0, int64(run.Count))
	}
}

// Close stops every listener and connection and waits for their goroutines. Rooms with bytes
// pending on a connection fail with transfer_error.
func (r *Receiver) Close() error {
	r.mu.Lock()
	r.closed = true
	for ln := range r.lns {
		ln.Close()
	}
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.stopPopulate()
	r.wg.Wait()
	return nil
}
