package transfer

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/pagelist"
)

// peer is one decode peer: a queue of rooms, the in-flight byte budget and ConnsPerPeer
// slots, each a goroutine that dials, serves one connection until it breaks and redials.
type peer struct {
	s      *Sender
	addr   string
	layout Layout // immutable

	mu       sync.Mutex
	queue    []*job
	inflight int64
	freed    chan struct{} // closed and replaced whenever budget is released
	conns    map[*txConn]struct{}
	closed   bool
	closeErr error
	wake     chan struct{} // 1-slot trigger: the queue has work
	done     chan struct{} // closed by close
}

func newPeer(s *Sender, addr string, layout Layout) *peer {
	return &peer{s: s, addr: addr, layout: layout, freed: make(chan struct{}), conns: make(map[*txConn]struct{}),
		wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// acquire takes n bytes of the in-flight budget, waiting while it is used up until ctx ends,
// the peer closes or fenced is closed (ErrFenced, reason fenced).
func (p *peer) acquire(ctx context.Context, n int64, fenced <-chan struct{}) error {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return ErrClosed
		}
		if p.inflight == 0 || p.inflight+n <= p.s.cfg.MaxInflightBytes {
			p.inflight += n
			p.mu.Unlock()
			return nil
		}
		ch := p.freed
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
			return ErrClosed
		case <-fenced:
			return fail(ReasonFenced, ErrFenced)
		case <-ch:
		}
	}
}

func (p *peer) release(n int64) {
	p.mu.Lock()
	p.inflight -= n
	close(p.freed)
	p.freed = make(chan struct{})
	p.mu.Unlock()
}

func (p *peer) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// enqueue queues an admitted job; one fenced meanwhile is left out (its fence freed it).
func (p *peer) enqueue(j *job) bool {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return false
	}
	j.mu.Lock()
	fenced := j.fenced
	j.mu.Unlock()
	if !fenced {
		p.queue = append(p.queue, j)
	}
	p.mu.Unlock()
	p.signal()
	return true
}

// drop removes a fenced job from the queue, if it is still there.
func (p *peer) drop(j *job) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i := slices.Index(p.queue, j); i >= 0 {
		p.queue = slices.Delete(p.queue, i, i+1)
	}
}

// pop hands the next job that is not stopped to a writer, or nil.
func (p *peer) pop() *job {
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.queue) > 0 {
		j := p.queue[0]
		p.queue[0] = nil
		p.queue = p.queue[1:]
		j.mu.Lock()
		ok := !j.stopped
		j.writing = ok
		j.mu.Unlock()
		if ok {
			if len(p.queue) > 0 {
				p.signal()
			}
			return j
		}
	}
	return nil
}

func (p *peer) close(err error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed, p.closeErr = true, err
	q := p.queue
	p.queue = nil
	close(p.done)
	for tc := range p.conns {
		tc.conn.Close()
	}
	p.mu.Unlock()
	for _, j := range q {
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
		tc := &txConn{p: p, conn: conn, awaiting: make(map[Key]*job), dead: make(chan struct{})}
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
	conn   net.Conn
	pingAt atomic.Int64 // unix nanos of the unanswered ping, 0 if none

	mu       sync.Mutex
	awaiting map[Key]*job

	dead    chan struct{} // closed when the reader ends
	readErr error

	hdr  [HeaderSize]byte
	meta []byte
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
		if j := tc.p.pop(); j != nil {
			if err := tc.sendJob(j); err != nil {
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
		case <-tc.p.wake:
		case <-t.C:
			if tc.pingAt.Load() == 0 {
				tc.pingAt.Store(time.Now().UnixNano())
				(&Header{Type: FramePing}).Encode(tc.hdr[:])
				if err := tc.write([][]byte{tc.hdr[:]}, HeaderSize); err != nil {
					return err
				}
			}
			t.Reset(cfg.KeepAlive)
		}
	}
}

// write writes n bytes under a deadline scaled by their size.
func (tc *txConn) write(iov [][]byte, n int64) error {
	tc.armWrite(n)
	return tc.writeArmed(iov)
}

func (tc *txConn) armWrite(n int64) {
	cfg := &tc.p.s.cfg
	tc.conn.SetWriteDeadline(deadlineFor(cfg.WriteTimeout, n, cfg.MinWriteRate))
}

// writeArmed writes iov under the deadline armWrite set.
func (tc *txConn) writeArmed(iov [][]byte) error {
	bufs := net.Buffers(iov)
	_, err := bufs.WriteTo(tc.conn)
	return err
}

// sendJob writes a room's chunks and DONE. It returns an error only if the connection broke.
func (tc *txConn) sendJob(j *job) error {
	key := j.req.Key
	tc.mu.Lock()
	tc.awaiting[key] = j
	tc.mu.Unlock()
	sent, err := tc.writeJob(j)
	if !sent && err == nil { // abandoned: stopped by Fence or by a failure result
		tc.mu.Lock()
		if tc.awaiting[key] == j {
			delete(tc.awaiting, key)
		}
		tc.mu.Unlock()
	}
	j.setWriting(false)
	return err
}

// chunkPlan is one chunk of a room: the destination runs it names and the
// source pages it carries.
type chunkPlan struct {
	buf   int
	runs  []Run
	iov   [][]byte // iov[0] is left for the header
	bytes int64
}

// planChunks splits a job's segments into chunks of at most MaxChunkBytes
// (at least one page each), pagelist.MaxRuns runs and pagelist.MaxPages
// pages, the bounds the receiver checks each chunk against.
func (tc *txConn) planChunks(j *job) []chunkPlan {
	s := tc.p.s
	cfg := &s.cfg
	var plans []chunkPlan
	for b, segs := range j.segs {
		itemLen := s.region.layout.Buffers[b].ItemLen
		i, off := 0, int32(0)
		for i < len(segs) {
			c := chunkPlan{buf: b, iov: [][]byte{nil}}
			for i < len(segs) && len(c.runs) < pagelist.MaxRuns {
				seg := segs[i]
				n := int64(seg.Count - off)
				if room := (cfg.MaxChunkBytes - c.bytes) / itemLen; room < n {
					n = room
				}
				if room := pagelist.MaxPages - c.bytes/itemLen; room < n {
					n = room
				}
				if n <= 0 {
					if c.bytes > 0 {
						break
					}
					n = 1 // a chunk holds at least one page
				}
				c.runs = append(c.runs, Run{Start: seg.Dst + off, Count: int32(n)})
				c.iov = append(c.iov, s.region.Pages(b, Run{Start: seg.Src + off, Count: int32(n)}))
				c.bytes += n * itemLen
				if off += int32(n); off == seg.Count {
					i, off = i+1, 0
				}
			}
			plans = append(plans, c)
		}
	}
	return plans
}

// checksums computes the chunks' crc32c one or two chunks ahead of the
// writer, on its own goroutine, so the checksum pass over the next chunk
// overlaps the kernel copy of this one. It reads source pages, so it holds
// the job like the writer does (I9: Fence waits for it too). The channel
// closes early if the job is stopped; quit ends it when the writer gives up.
func checksums(j *job, plans []chunkPlan, quit <-chan struct{}) <-chan uint32 {
	out := make(chan uint32, 2)
	go func() {
		defer close(out)
		for _, c := range plans {
			if !j.acquire() {
				return
			}
			var crc uint32
			for _, p := range c.iov[1:] {
				crc = crc32.Update(crc, castagnoli, p)
			}
			j.release()
			select {
			case out <- crc:
			case <-quit:
				return
			}
		}
	}()
	return out
}

func (tc *txConn) writeJob(j *job) (bool, error) {
	s := tc.p.s
	cfg := &s.cfg
	var flags uint16
	if cfg.Checksum == ChecksumCRC32C {
		flags = FlagPayloadCRC
	}
	plans := tc.planChunks(j)
	var crcs <-chan uint32
	if flags != 0 {
		quit := make(chan struct{})
		defer close(quit)
		crcs = checksums(j, plans, quit)
	}
	for seq, c := range plans {
		var crc uint32
		if crcs != nil {
			var ok bool
			if crc, ok = <-crcs; !ok {
				return false, nil // stopped by Fence
			}
		}
		tc.meta = AppendRuns(append(tc.meta[:0], make([]byte, HeaderSize)...), c.runs)
		h := Header{Type: FrameChunk, Flags: flags, Room: j.req.Key.Room, Nonce: j.req.Key.Nonce, Seq: uint32(seq),
			Buffer: uint32(c.buf), NumRuns: uint32(len(c.runs)), Pages: uint32(CountPages(c.runs)),
			PayloadLen: uint64(c.bytes), PayloadCRC: crc, RunsCRC: RunsChecksum(tc.meta[HeaderSize:])}
		h.Encode(tc.meta)
		c.iov[0] = tc.meta
		if !j.acquireWrite(tc, int64(len(tc.meta))+c.bytes) {
			return false, nil
		}
		err := tc.writeArmed(c.iov)
		j.release()
		if err != nil {
			return false, err
		}
	}
	seq := uint32(len(plans))
	j.mu.Lock()
	stopped := j.stopped
	j.mu.Unlock()
	if stopped {
		return false, nil
	}
	var crc uint32
	if flags != 0 {
		crc = crc32.Checksum(j.aux, castagnoli)
	}
	h := Header{Type: FrameDone, Flags: flags, Room: j.req.Key.Room, Nonce: j.req.Key.Nonce, Seq: seq,
		Pages: uint32(j.pages), PayloadLen: uint64(len(j.aux)), PayloadCRC: crc}
	h.Encode(tc.hdr[:])
	if err := tc.write([][]byte{tc.hdr[:], j.aux}, HeaderSize+int64(len(j.aux))); err != nil {
		return false, err
	}
	return true, nil
}

// readLoop reads results and pongs. It wakes every KeepAlive to check that an outstanding
// ping was answered within IdleTimeout; while the writer is busy no ping is outstanding and
// the write deadlines cover a stalled receiver.
func (tc *txConn) readLoop() error {
	cfg := &tc.p.s.cfg
	var hdr [HeaderSize]byte
	for {
		off := 0
		for off < HeaderSize {
			tc.conn.SetReadDeadline(time.Now().Add(cfg.KeepAlive))
			n, err := tc.conn.Read(hdr[off:])
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

// resultError maps a result frame's status to the room's outcome.
func resultError(status uint32) error {
	switch r := reasonFromCode(status); {
	case status == uint32(codeOK):
		return nil
	case r == ReasonChecksum:
		return fail(r, fmt.Errorf("%w (reported by receiver)", ErrChecksum))
	case r == ReasonTransferError:
		return fail(r, fmt.Errorf("%w (reported by receiver)", ErrConnBroken))
	default:
		return fail(r, ErrRejected)
	}
}
