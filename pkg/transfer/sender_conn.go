package transfer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/pagelist"
)

// peer is one decode peer: the in-flight byte budget with the pieces waiting for it, and
// ConnsPerPeer slots, each a queue of admitted pieces and a goroutine that dials, serves one
// connection until it breaks and redials. The budget admits a piece chunk by chunk.
type peer struct {
	s      *Sender
	addr   string
	layout Layout // immutable

	mu       sync.Mutex
	waiting  []*piece // appended, not yet admitted whole, in append order
	closes   uint64   // streams whose last piece was appended so far; orders nextLocked
	inflight int64
	admitted chan struct{} // closed and replaced whenever chunks are admitted
	// closedAdmitted are the streams whose last piece was admitted whole under mu: unlock
	// tells them (Stream.Admitted) once mu is released.
	closedAdmitted []*job
	slots          []*slot
	streams        map[*job]struct{} // open streams, failed if the peer closes
	conns          map[*txConn]struct{}
	closed         bool
	closeErr       error
	done           chan struct{} // closed by close
}

// slot is one connection slot's queue; the streams pinned to it are written by its
// goroutine only, in nextLocked's order.
type slot struct {
	queue    []*piece
	inflight int64         // the part of the peer's inflight admitted onto this slot
	streams  int           // open streams pinned here
	wake     chan struct{} // 1-slot trigger: the queue has work
}

func newPeer(s *Sender, addr string, layout Layout, slots int) *peer {
	p := &peer{s: s, addr: addr, layout: layout, admitted: make(chan struct{}), streams: make(map[*job]struct{}),
		conns: make(map[*txConn]struct{}), done: make(chan struct{})}
	for range slots {
		p.slots = append(p.slots, &slot{wake: make(chan struct{}, 1)})
	}
	return p
}

// open pins a new stream to the slot with the fewest open streams.
func (p *peer) open(j *job) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	for i, sl := range p.slots {
		if sl.streams < p.slots[j.slot].streams {
			j.slot = i
		}
	}
	p.slots[j.slot].streams++
	p.streams[j] = struct{}{}
	return true
}

// unlock releases mu, then calls Stream.Admitted of the streams whose last piece was
// admitted meanwhile (under no lock: the callback may call the Sender). A stream fenced
// by then is not told.
func (p *peer) unlock() {
	closed := p.closedAdmitted
	p.closedAdmitted = nil
	p.mu.Unlock()
	for _, j := range closed {
		j.mu.Lock()
		fenced := j.fenced
		j.mu.Unlock()
		if f := j.st.Admitted; f != nil && !fenced {
			f()
		}
	}
}

// forget drops an ended stream and its queued pieces.
func (p *peer) forget(j *job) {
	p.mu.Lock()
	defer p.unlock()
	if _, ok := p.streams[j]; ok {
		delete(p.streams, j)
		p.slots[j.slot].streams--
	}
	p.dropLocked(j)
}

// append queues a piece behind the pieces already waiting for the budget.
func (p *peer) append(w *piece) error {
	p.mu.Lock()
	defer p.unlock()
	if p.closed {
		return fmt.Errorf("%w: %s", ErrUnknownPeer, p.addr)
	}
	w.j.mu.Lock()
	stopped, fenced := w.j.stopped, w.j.fenced
	w.j.mu.Unlock()
	switch {
	case fenced:
		return fail(ReasonFenced, ErrFenced)
	case stopped: // failed meanwhile: its Done tells why
		return fmt.Errorf("%w: %v", ErrStreamEnded, w.j.st.Key)
	}
	w.j.unadmitted++
	if w.last {
		p.closes++
		w.j.closedAt = p.closes
	}
	p.waiting = append(p.waiting, w)
	p.admitLocked()
	return nil
}

// nextLocked returns the index in pieces (the waiting list or a slot's queue) of the piece
// to admit or write next: the first piece of the stream that closed (its last piece
// appended) first, else the oldest piece. Always a stream's first piece in the list, so
// each stream's pieces keep their order. A closing stream's end no longer waits behind the
// pieces of streams still being produced: with rooms back to back, FIFO made each room's
// last chunk wait for every room's pieces interleaved ahead of it (last chunk -> Success
// p50 146 ms). Closing streams go in the order they closed, not fewest bytes first, which
// let shorter rooms overtake a long one again and again (first Send -> Success p99 0.5 ->
// 4 s). An open stream waits only while closing streams have pieces queued, and every
// stream closes or is fenced.
func (p *peer) nextLocked(pieces []*piece) int {
	if len(pieces) == 0 {
		return -1
	}
	best := 0
	for i, w := range pieces {
		if c, b := w.j.closedAt, pieces[best].j.closedAt; c != 0 && (b == 0 || c < b) {
			best = i
		}
	}
	return best
}

// nextWaitingLocked returns the index in the waiting list of the piece to admit next:
// nextLocked's choice among the pieces of the slot holding the fewest admitted bytes (of
// those with pieces waiting). Admitting in nextLocked's order alone put the budget on one
// room, so on one connection: back to back, 2.6 instead of 3.1 GB/s.
func (p *peer) nextWaitingLocked() int {
	best, bestSlot := -1, -1
	for i, w := range p.waiting {
		s := w.j.slot
		switch {
		case best < 0, p.slots[s].inflight < p.slots[bestSlot].inflight:
		case s != bestSlot:
			continue
		default:
			if c, b := w.j.closedAt, p.waiting[best].j.closedAt; c == 0 || (b != 0 && c >= b) {
				continue
			}
		}
		best, bestSlot = i, s
	}
	return best
}

// admitLocked admits waiting pieces' chunks, one at a time in nextWaitingLocked's order,
// while the budget has room (a chunk larger than the budget alone); a piece with a chunk
// admitted is in its stream's slot's queue. Admitting whole pieces made a closing stream's
// last chunk wait behind whole pieces of other rooms (32 MiB each in the demo) admitted
// before it closed; now it waits for one chunk's bytes to come back.
func (p *peer) admitLocked() {
	n := 0
	for len(p.waiting) > 0 {
		i := p.nextWaitingLocked()
		w := p.waiting[i]
		c := w.charges[w.admitted]
		if p.inflight != 0 && p.inflight+c > p.s.cfg.MaxInflightBytes {
			break
		}
		sl := p.slots[w.j.slot]
		p.inflight += c
		sl.inflight += c
		w.left += c
		if w.admitted++; w.admitted == len(w.charges) {
			p.waiting = slices.Delete(p.waiting, i, i+1)
			if w.j.unadmitted--; w.last {
				p.closedAdmitted = append(p.closedAdmitted, w.j)
			}
		}
		if !w.queued {
			w.queued = true
			sl.queue = append(sl.queue, w)
		}
		signal(sl.wake)
		n++
	}
	if n > 0 {
		p.wakeWaitersLocked()
	}
}

// wakeWaitersLocked wakes the WaitAdmitted calls and writers waiting for admission: a
// stream's count of waiting pieces changed. A stream that failed with pieces waiting has
// none any more: its WaitAdmitted returns at once (Done says why), not at its ctx's end.
func (p *peer) wakeWaitersLocked() {
	close(p.admitted)
	p.admitted = make(chan struct{})
}

// releaseLocked gives n bytes of w's charge (at most what it still holds) back to the budget.
func (p *peer) releaseLocked(w *piece, n int64) {
	n = min(n, w.left)
	if n <= 0 {
		return
	}
	w.left -= n
	p.inflight -= n
	p.slots[w.j.slot].inflight -= n
	p.admitLocked()
}

func signal(wake chan struct{}) {
	select {
	case wake <- struct{}{}:
	default:
	}
}

// dropPieces removes a stopped stream's pieces from the waiting list and its slot's queue,
// giving their budget back.
func (p *peer) dropPieces(j *job) {
	p.mu.Lock()
	defer p.unlock()
	p.dropLocked(j)
}

// dropLocked drops j's pieces from the waiting list and its slot's queue, with the budget
// they hold; a piece its slot's writer holds is the writer's to give back.
func (p *peer) dropLocked(j *job) {
	var mine []*piece
	if j.unadmitted > 0 {
		p.waiting = slices.DeleteFunc(p.waiting, func(w *piece) bool {
			if w.j == j && !w.queued {
				mine = append(mine, w)
			}
			return w.j == j
		})
		j.unadmitted = 0
		p.wakeWaitersLocked()
	}
	sl := p.slots[j.slot]
	sl.queue = slices.DeleteFunc(sl.queue, func(w *piece) bool {
		if w.j == j {
			mine = append(mine, w)
		}
		return w.j == j
	})
	for _, w := range mine {
		p.releaseLocked(w, w.left-w.shmHeld)
	}
}

// pop hands the slot's next piece of a stream that is not stopped to its writer, or nil.
// The piece stays queued (held by the writer) until the writer lets it go.
func (p *peer) pop(i int) *piece {
	p.mu.Lock()
	defer p.unlock()
	sl := p.slots[i]
	for len(sl.queue) > 0 {
		k := p.nextLocked(sl.queue)
		w := sl.queue[k]
		sl.queue = slices.Delete(sl.queue, k, k+1)
		w.j.mu.Lock()
		ok := !w.j.stopped
		w.j.writing = ok
		w.j.mu.Unlock()
		if ok {
			if len(sl.queue) > 0 {
				signal(sl.wake)
			}
			return w
		}
		w.queued = false
		p.releaseLocked(w, w.left-w.shmHeld)
		p.dropLocked(w.j) // its later chunks must not queue it again
	}
	return nil
}

// abandon takes a piece its writer let go of unwritten (its stream stopped or its
// connection broke) off the waiting list and gives back what it holds: admitting its later
// chunks would hold budget no writer gives back (dropLocked leaves a piece a writer holds
// to that writer).
func (p *peer) abandon(w *piece) {
	p.mu.Lock()
	defer p.unlock()
	if i := slices.Index(p.waiting, w); i >= 0 {
		p.waiting = slices.Delete(p.waiting, i, i+1)
		w.j.unadmitted--
		p.wakeWaitersLocked()
	}
	w.queued = false
	p.releaseLocked(w, w.left-w.shmHeld)
}

// turn is what a slot's writer does next with its piece.
type turn int

const (
	turnWrite turn = iota // write the piece's next chunk: it is admitted
	turnWait              // wait for the next chunk's admission (on the channel turnOf returns)
	turnYield             // let the piece go: another piece of the slot goes first
)

// turnOf gives back give bytes of w's budget (the chunk just written) and decides, under one
// lock, the writer's turn for w's next chunk. The writer yields to a piece queued on its
// slot whose stream closed before w's (closing streams first, chunk by chunk), and, while
// w's next chunk waits for admission, to any piece queued there (its chunks are admitted:
// waiting instead would hold their budget). A yielded piece with admitted chunks left goes
// back to the head of the slot's queue; one with none waits to be queued again by admission.
func (p *peer) turnOf(w *piece, give int64) (turn, <-chan struct{}) {
	p.mu.Lock()
	defer p.unlock()
	p.releaseLocked(w, give)
	sl := p.slots[w.j.slot]
	admitted := w.admitted > w.written
	if !p.preemptsLocked(sl.queue, w) && (admitted || len(sl.queue) == 0) {
		if admitted {
			return turnWrite, nil
		}
		return turnWait, p.admitted
	}
	if admitted {
		sl.queue = slices.Insert(sl.queue, 0, w)
	} else {
		w.queued = false
	}
	signal(sl.wake)
	return turnYield, nil
}

// preemptsLocked reports whether queue holds a piece of a stream that closed before w's.
func (p *peer) preemptsLocked(queue []*piece, w *piece) bool {
	for _, q := range queue {
		if c := q.j.closedAt; c != 0 && (w.j.closedAt == 0 || c < w.j.closedAt) {
			return true
		}
	}
	return false
}

func (p *peer) close(err error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed, p.closeErr = true, err
	open := make([]*job, 0, len(p.streams))
	for j := range p.streams {
		open = append(open, j)
	}
	close(p.done)
	for tc := range p.conns {
		tc.conn.Close()
	}
	p.mu.Unlock()
	for _, j := range open {
		j.finish(fail(ReasonTransferError, err))
	}
}

// runSlot keeps one connection to the peer: dial with deadline, serve, redial with backoff.
func (p *peer) runSlot(slot int) {
	cfg := &p.s.cfg
	backoff := cfg.RedialMin
	for {
		select {
		case <-p.done:
			return
		default:
		}
		conn, err := p.dial()
		if err != nil {
			p.s.log.Warn("data dial failed", zap.String("peer", p.addr), zap.Int("slot", slot),
				zap.Duration("backoff", backoff), zap.Error(err))
			t := time.NewTimer(backoff)
			select {
			case <-p.done:
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, cfg.RedialMax)
			continue
		}
		backoff = cfg.RedialMin
		tc := &txConn{p: p, slot: slot, conn: conn, awaiting: make(map[Key]*job), dead: make(chan struct{}), shm: newTxShm()}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			conn.Close()
			return
		}
		p.conns[tc] = struct{}{}
		p.mu.Unlock()
		err = tc.run()
		p.mu.Lock()
		delete(p.conns, tc)
		p.mu.Unlock()
		p.s.log.Info("data connection lost", zap.String("peer", p.addr), zap.Int("slot", slot), zap.Error(err))
	}
}

func (p *peer) dial() (net.Conn, error) {
	cfg := &p.s.cfg
	ctx, cancel := context.WithTimeout(context.Background(), cfg.DialTimeout)
	defer cancel()
	go func() { // make a pending dial end promptly when the peer is closed
		select {
		case <-p.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	c, err := cfg.Dialer.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	deadline, _ := ctx.Deadline()
	c.SetDeadline(deadline)
	ac, err := cfg.Auth.Client(ctx, c)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("%w: %w", ErrAuth, err)
	}
	ac.SetDeadline(time.Time{})
	return ac, nil
}

// txConn is one data connection. Its writer goroutine (the slot's) is the only writer and
// the only reader of source pages on its behalf; its reader goroutine reads results and
// pongs. Both end when either fails; the rooms awaiting on it then fail with transfer_error.
type txConn struct {
	p      *peer
	slot   int
	conn   net.Conn
	pingAt atomic.Int64 // unix nanos of the unanswered ping, 0 if none

	mu       sync.Mutex
	awaiting map[Key]*job // by the frames' key, rank included

	dead    chan struct{} // closed when the reader ends
	readErr error

	hdr  [HeaderSize]byte
	meta []byte
	// shm is the connection's same-host state (shm_sender.go).
	shm txShm
}

func (tc *txConn) run() error {
	go func() {
		tc.readErr = tc.readLoop()
		tc.conn.Close()
		close(tc.dead)
	}()
	err := tc.writeLoop()
	tc.conn.Close()
	<-tc.dead
	if err == nil || errors.Is(err, net.ErrClosed) {
		err = tc.readErr
	}
	tc.mu.Lock()
	aw := tc.awaiting
	tc.awaiting = nil
	tc.mu.Unlock()
	tc.shmConnEnded()
	for _, j := range aw {
		j.finish(fail(ReasonTransferError, fmt.Errorf("%w: %w", ErrConnBroken, err)))
	}
	return err
}

func (tc *txConn) writeLoop() error {
	cfg := &tc.p.s.cfg
	t := time.NewTimer(cfg.KeepAlive)
	defer t.Stop()
	for {
		if w := tc.p.pop(tc.slot); w != nil {
			if err := tc.sendPiece(w); err != nil {
				return err
			}
			t.Reset(cfg.KeepAlive)
			continue
		}
		select {
		case <-tc.p.done:
			return tc.p.closeErr
		case <-tc.dead:
			return tc.readErr
		case <-tc.p.slots[tc.slot].wake:
		case <-t.C:
			if err := tc.ping(); err != nil {
				return err
			}
			t.Reset(cfg.KeepAlive)
		}
	}
}

// ping writes a PING unless one is unanswered.
func (tc *txConn) ping() error {
	if tc.pingAt.Load() != 0 {
		return nil
	}
	tc.pingAt.Store(time.Now().UnixNano())
	var h [HeaderSize]byte // not tc.hdr: a piece waiting mid-stream may hold its DONE there
	(&Header{Type: FramePing}).Encode(h[:])
	return tc.write([][]byte{h[:]}, HeaderSize)
}

// write writes n bytes under a deadline scaled by their size. A chunk's write is armed by
// acquireWrite instead and goes through writeArmed: arming it again here, outside the job's
// lock, could undo a fence's interrupt.
func (tc *txConn) write(iov [][]byte, n int64) error {
	tc.armWrite(n)
	return tc.writeArmed(nil, iov)
}

func (tc *txConn) armWrite(n int64) {
	cfg := &tc.p.s.cfg
	tc.conn.SetWriteDeadline(deadlineFor(cfg.WriteTimeout, n, cfg.MinWriteRate))
}

// writeArmed writes iov, whose payload is region's memory (nil: none is), under the
// deadline armWrite set.
func (tc *txConn) writeArmed(region *Region, iov [][]byte) error {
	s := tc.p.s
	bufs := net.Buffers(iov)
	var err error
	if fault := touchRegion(region, s.log, s.beforeTouch, func() { _, err = bufs.WriteTo(tc.conn) }); fault != nil {
		return fault
	}
	return regionIOError(region, s.log, err)
}

// sendPiece writes a piece's admitted chunks and, after the last piece's last chunk, the
// stream's DONE, unless the piece yields (turnOf) or its stream stops. It returns an error
// only if the connection broke. Each chunk's budget is given back as its write returns, the
// rest when the piece is abandoned.
func (tc *txConn) sendPiece(w *piece) error {
	j := w.j
	key := j.st.Key
	tc.mu.Lock()
	tc.awaiting[key] = j
	tc.mu.Unlock()
	end, err := tc.writePiece(w)
	switch end {
	case pieceWritten:
		tc.p.releaseUnheld(w)
	case pieceAbandoned:
		tc.p.abandon(w)
	}
	if end == pieceAbandoned && err == nil { // stopped by Fence or by a failure result
		tc.mu.Lock()
		if tc.awaiting[key] == j {
			delete(tc.awaiting, key)
		}
		tc.mu.Unlock()
	}
	j.setWriting(false)
	return err
}

// pieceEnd is how a writer let go of a piece.
type pieceEnd int

const (
	pieceWritten   pieceEnd = iota // every chunk, and the DONE after a last piece, is written
	pieceYielded                   // back to wait for admission or behind a closing stream
	pieceAbandoned                 // the stream stopped (fenced or failed) or the connection broke
)

// chunkPlan is one chunk of a stream: the destination runs it names, over any of the
// piece's buffers, and the source pages it carries.
type chunkPlan struct {
	runs  []ChunkRun
	iov   [][]byte // iov[0] is left for the header
	bytes int64
	pages int64 // page-buffer pairs
	// sliced chunks name slices instead of runs (slices.go); pages counts page-slice pairs.
	sliced bool
	slices []SliceRun
	// srcStarts[k] is runs[k]'s (or slices[k]'s) first source page (a shm chunk names them,
	// shm_sender.go).
	srcStarts []int32
}

// planChunks packs a piece's segments, buffer after buffer, into chunks of at most
// MaxChunkBytes (at least one page each), pagelist.MaxRuns runs and pagelist.MaxPages pages,
// the bounds the receiver checks each chunk against. A chunk does not end where a buffer
// does: the pages of a small piece over many buffers travel as one chunk, not one per buffer.
func (s *Sender) planChunks(w *piece) ([]chunkPlan, bool) {
	if w.j.copies != nil {
		return s.planSlicedChunks(w)
	}
	cfg := &s.cfg
	// A piece is checked against the region's mapping at Append; one that
	// no longer fits was taken before the region was replaced, and its
	// room fenced before that: nothing of it may be planned or read.
	region := w.j.region
	layout := region.Layout()
	if len(w.segs) > len(layout.Buffers) {
		return nil, false
	}
	var plans []chunkPlan
	c := chunkPlan{iov: [][]byte{nil}}
	flush := func() {
		plans = append(plans, c)
		c = chunkPlan{iov: [][]byte{nil}}
	}
	for b, segs := range w.segs {
		itemLen := layout.Buffers[b].ItemLen
		i, off := 0, int32(0)
		for i < len(segs) {
			if len(c.runs) == pagelist.MaxRuns {
				flush()
			}
			seg := segs[i]
			n := min(int64(seg.Count-off), (cfg.MaxChunkBytes-c.bytes)/itemLen, pagelist.MaxPages-c.pages)
			if n <= 0 {
				if c.bytes > 0 {
					flush()
					continue
				}
				n = 1 // a chunk holds at least one page
			}
			c.runs = append(c.runs, ChunkRun{Buffer: uint32(b), Run: Run{Start: seg.Dst + off, Count: int32(n)}})
			c.iov = append(c.iov, region.Pages(b, Run{Start: seg.Src + off, Count: int32(n)}))
			c.srcStarts = append(c.srcStarts, seg.Src+off)
			c.bytes += n * itemLen
			c.pages += n
			if off += int32(n); off == seg.Count {
				i, off = i+1, 0
			}
		}
	}
	if len(c.runs) > 0 {
		flush()
	}
	return plans, true
}

// checksums computes the piece's chunks' crc32c from the first not yet summed, one or two
// chunks ahead of the writer, on its own goroutine, so the checksum pass over the next
// chunk overlaps the kernel copy of this one. It reads source pages, so it holds the job
// like the writer does (I9: Fence waits for it too). Each sum is kept in the piece, so a
// piece that yields mid-way and is written again later does not sum its chunks twice. The
// channel closes early if the job is stopped; quit ends it when the writer lets go (after
// the sum in progress), and exited closes once it ended (the piece's sums are the writer's
// again). The Sender's WaitGroup counts it, so Close returns after it. A fault on the
// pages (the file truncated under them) is stored in w.fault before the channel closes.
func checksums(w *piece, quit <-chan struct{}) (sums <-chan uint32, exited <-chan struct{}) {
	out, done := make(chan uint32, 2), make(chan struct{})
	if w.crcs == nil {
		w.crcs = make([]uint32, len(w.plans))
	}
	s := w.j.s
	s.wg.Add(1) // Close waits for it: it reads the region's pages
	go func() {
		defer s.wg.Done()
		defer close(done)
		defer close(out)
		for w.summed < len(w.plans) {
			select {
			case <-quit:
				return
			default:
			}
			if !w.j.acquire() {
				return
			}
			var crc uint32
			err := touchRegion(w.j.region, s.log, s.beforeTouch, func() {
				crc = sumAhead(0, w.plans[w.summed].iov[1:])
			})
			w.j.release()
			if err != nil {
				w.fault = err
				return
			}
			w.crcs[w.summed] = crc
			w.summed++
			select {
			case out <- crc:
			case <-quit:
				return
			}
		}
	}()
	return out, done
}

// sumBlock is the stride of sumAhead: the block summed while the next one is touched.
const sumBlock = 32 << 10

// sumAhead returns crc updated over bufs end to end, block by block, after reading one
// byte of each cache line of the block that follows: the source pages are cold (the engine
// wrote them long ago, or another core did), and the sum alone waits on each line in turn
// (7.8 GB/s over cold memory beside 23 from cache), while the touches' loads run ahead of
// each other and bring the next block in: BenchmarkSumAhead, 0.10-0.13 -> 0.08-0.10
// CPU-s/GB (16 and 64 KiB blocks, or touching two blocks ahead, did no better).
func sumAhead(crc uint32, bufs [][]byte) uint32 {
	var sink byte
	for i, p := range bufs {
		for off := 0; off < len(p); off += sumBlock {
			end := min(off+sumBlock, len(p))
			next := p[end:min(end+sumBlock, len(p))]
			if len(next) == 0 && i+1 < len(bufs) {
				next = bufs[i+1][:min(sumBlock, len(bufs[i+1]))]
			}
			for k := 0; k < len(next); k += 64 {
				sink ^= next[k]
			}
			crc = crc32.Update(crc, castagnoli, p[off:end])
		}
	}
	runtime.KeepAlive(sink) // the touches' loads are the point: keep them
	return crc
}

// writePiece writes a piece's chunks from the first not yet written, continuing the
// stream's seq, each once admitted, then the stream's DONE after its last piece (in the
// write of its last chunk).
func (tc *txConn) writePiece(w *piece) (end pieceEnd, err error) {
	j := w.j
	s := tc.p.s
	cfg := &s.cfg
	var flags uint16
	if cfg.Checksum == ChecksumCRC32C {
		flags = FlagPayloadCRC
	}
	if w.summing != nil {
		// The checksum goroutine of the piece's last turn: ended, or about to, once told
		// to quit; not waited for as the piece yielded, so a yield costs the writer no crc.
		<-w.summing
		w.summing = nil
	}
	var crcs <-chan uint32
	summed := w.summed // chunks below it have their sum in w.crcs already
	if flags != 0 && w.summed < len(w.plans) {
		quit := make(chan struct{})
		crcs, w.summing = checksums(w, quit)
		defer func() {
			close(quit)
			if end != pieceYielded {
				<-w.summing // no read of the piece's pages outlives its writer's turn
			}
		}()
	}
	offer, useShm, err := tc.shmSourceFor(j, w)
	if err != nil {
		return pieceAbandoned, err
	}
	if !useShm && tc.p.s.cfg.Transport == KindShm && len(w.plans) > 0 {
		j.finish(fail(ReasonTransferError, fmt.Errorf("%w: %s", ErrShmRefused, tc.p.addr)))
		return pieceAbandoned, nil
	}
	var give int64 // the budget of the chunk just written, given back in turnOf
	for w.written < len(w.charges) {
		switch end, err := tc.awaitTurn(w, give); {
		case err != nil:
			return pieceAbandoned, err
		case end != pieceWritten:
			return end, nil
		}
		i := w.written
		if len(w.plans) == 0 { // a last piece of no pages: its DONE alone
			j.mu.Lock()
			stopped := j.stopped
			j.mu.Unlock()
			if stopped {
				return pieceAbandoned, nil
			}
			tc.encodeDone(j, w, flags, j.seq, j.sentPages)
			if err := tc.write([][]byte{tc.hdr[:], w.aux}, HeaderSize+int64(len(w.aux))); err != nil {
				return pieceAbandoned, err
			}
			w.written++
			return pieceWritten, nil
		}
		c := w.plans[i]
		var crc uint32
		switch {
		case flags == 0:
		case i < summed:
			crc = w.crcs[i]
		default:
			var ok bool
			if crc, ok = <-crcs; !ok {
				return pieceAbandoned, w.fault // stopped by Fence, or the pages faulted: the connection breaks
			}
		}
		if useShm {
			switch end, err := tc.writeShmChunk(w, i, flags, crc, offer); {
			case err != nil, end != pieceWritten:
				return end, err
			}
			continue
		}
		tc.meta = c.appendRunList(append(tc.meta[:0], zeroHeader[:]...))
		h := Header{Type: FrameChunk, Flags: flags | c.flags(), Room: j.st.Key.Room, Nonce: j.st.Key.Nonce, Rank: j.st.Key.Rank, From: j.st.Key.From,
			Seq: j.seq, NumRuns: c.entries(), Pages: uint32(c.pages),
			PayloadLen: uint64(c.bytes), PayloadCRC: crc, RunsCRC: RunsChecksum(tc.meta[HeaderSize:])}
		h.Encode(tc.meta)
		c.iov[0] = tc.meta
		iov, n := c.iov, int64(len(tc.meta))+c.bytes
		if w.last && i == len(w.plans)-1 {
			// The stream's DONE goes in the same write as its last chunk: one syscall, and
			// often one read on the receiver, less per room.
			tc.encodeDone(j, w, flags, j.seq+1, j.sentPages+c.pages)
			iov = append(iov[:len(iov):len(iov)], tc.hdr[:], w.aux)
			n += HeaderSize + int64(len(w.aux))
		}
		if !j.acquireWrite(tc, n) {
			return pieceAbandoned, nil
		}
		err := tc.writeArmed(w.j.region, iov)
		j.release()
		if err != nil {
			return pieceAbandoned, err
		}
		j.seq++
		j.sentPages += c.pages
		w.written++
		give = w.charges[i]
		if progress := j.st.Progress; progress != nil {
			progress(c.bytes)
		}
	}
	return pieceWritten, nil // sendPiece gives the last chunk's budget back
}

// awaitTurn gives back give bytes and waits until w's next chunk may be written
// (pieceWritten), w yields (pieceYielded), its stream stops (pieceAbandoned) or the
// connection or peer ends (an error). A wait longer than KeepAlive pings, as the idle
// writer does, so the receiver's idle timeout does not take it for a dead peer.
func (tc *txConn) awaitTurn(w *piece, give int64) (pieceEnd, error) {
	var keepAlive *time.Timer
	defer func() {
		if keepAlive != nil {
			keepAlive.Stop()
		}
	}()
	for {
		t, admitted := tc.p.turnOf(w, give)
		give = 0
		switch t {
		case turnWrite:
			return pieceWritten, nil
		case turnYield:
			return pieceYielded, nil
		}
		if keepAlive == nil {
			keepAlive = time.NewTimer(tc.p.s.cfg.KeepAlive)
		}
		select {
		case <-admitted:
		case <-tc.p.slots[tc.slot].wake:
		case <-keepAlive.C:
			if err := tc.ping(); err != nil {
				return pieceAbandoned, err
			}
			keepAlive.Reset(tc.p.s.cfg.KeepAlive)
		case <-w.j.fenceCh:
			return pieceAbandoned, nil
		case <-tc.p.done:
			return pieceAbandoned, tc.p.closeErr
		case <-tc.dead:
			return pieceAbandoned, tc.readErr
		}
	}
}

// zeroHeader is the room a chunk's header takes before it is encoded.
var zeroHeader [HeaderSize]byte

// encodeDone encodes into tc.hdr the DONE of w's stream after chunks chunks of pages pages.
func (tc *txConn) encodeDone(j *job, w *piece, flags uint16, chunks uint32, pages int64) {
	var crc uint32
	if flags != 0 {
		crc = crc32.Checksum(w.aux, castagnoli)
	}
	h := Header{Type: FrameDone, Flags: flags, Room: j.st.Key.Room, Nonce: j.st.Key.Nonce, Rank: j.st.Key.Rank, From: j.st.Key.From, Seq: chunks,
		Pages: uint32(pages), PayloadLen: uint64(len(w.aux)), PayloadCRC: crc}
	h.Encode(tc.hdr[:])
}

// readerBufBytes is the read buffering of a sender's connection: 64 replies.
const readerBufBytes = 64 * HeaderSize

// readLoop reads results and pongs. It wakes every KeepAlive to check that an outstanding
// ping was answered within IdleTimeout; while the writer is busy no ping is outstanding and
// the write deadlines cover a stalled receiver.
func (tc *txConn) readLoop() error {
	cfg := &tc.p.s.cfg
	var hdr [HeaderSize]byte
	// Buffered: decode writes several COPIEDs at once, and one read takes them all.
	in := bufio.NewReaderSize(tc.conn, readerBufBytes)
	for {
		off := 0
		for off < HeaderSize {
			if in.Buffered() < HeaderSize-off {
				tc.conn.SetReadDeadline(time.Now().Add(cfg.KeepAlive))
			}
			n, err := in.Read(hdr[off:])
			off += n
			if err != nil {
				var ne net.Error
				if !errors.As(err, &ne) || !ne.Timeout() {
					return err
				}
				if at := tc.pingAt.Load(); at != 0 && time.Since(time.Unix(0, at)) > cfg.IdleTimeout {
					return fmt.Errorf("%w: no answer to ping within %v", ErrConnBroken, cfg.IdleTimeout)
				}
			}
		}
		h, err := DecodeHeader(hdr[:])
		if err != nil {
			return err
		}
		tc.pingAt.Store(0)
		switch h.Type {
		case FramePong:
		case FrameShmAnswer:
			tc.shmAnswer(h)
		case FrameCopied:
			tc.shmCopied(h)
		case FrameResult:
			tc.mu.Lock()
			j := tc.awaiting[h.Key()]
			delete(tc.awaiting, h.Key())
			tc.mu.Unlock()
			if j == nil {
				continue // a late result for a room already finished or fenced
			}
			j.finish(resultError(h.Status))
		default:
			return fmt.Errorf("%w: %d from receiver", ErrBadFrameType, h.Type)
		}
	}
}

// resultError maps a result frame's status to the room's outcome: nil, or the reason
// with a ResultError naming the code.
func resultError(status uint32) error {
	if status == uint32(codeOK) {
		return nil
	}
	r := reasonFromCode(status)
	return fail(r, &ResultError{Code: status, Reason: r})
}
