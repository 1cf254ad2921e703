package transfer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"slices"
	"time"

	"go.uber.org/zap"
)

// Serve accepts data connections on ln until ln fails or the Receiver is closed. Each
// connection gets one goroutine, the only one that reads it, writes it and writes region
// memory on its behalf. Serve returns nil after Close.
func (r *Receiver) Serve(ln net.Listener) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		ln.Close()
		return ErrClosed
	}
	r.lns[ln] = struct{}{}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		delete(r.lns, ln)
		r.mu.Unlock()
	}()
	backoff := 5 * time.Millisecond
	for {
		c, err := ln.Accept()
		if err != nil {
			r.mu.Lock()
			closed := r.closed
			r.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(backoff)
				backoff = min(2*backoff, time.Second)
				continue
			}
			return fmt.Errorf("accept data connection: %w", err)
		}
		backoff = 5 * time.Millisecond
		r.ServeConn(c)
	}
}

// ServeConn serves one already accepted connection in a new goroutine.
func (r *Receiver) ServeConn(c net.Conn) {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		c.Close()
		return
	}
	r.conns[c] = struct{}{}
	r.wg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		rc := &rxConn{r: r, raw: c, pending: make(map[*rxRoom]struct{}), scratch: make([]byte, 64<<10)}
		err := rc.serve()
		c.Close()
		r.mu.Lock()
		delete(r.conns, c)
		r.mu.Unlock()
		rc.failPending(err)
		rc.closeShm()
	}()
}

// readBufBytes is the read buffering of a data connection: a one-page room of 64 buffers
// of 256-byte pages (one chunk of 16 KiB and its DONE) fits, a 32 KiB page does not.
const readBufBytes = 32 << 10

// rxConn is the state of one data connection, owned by its goroutine.
type rxConn struct {
	r   *Receiver
	raw net.Conn
	c   net.Conn // after the Authenticator; deadlines are set here
	// in reads c: small frames (a header, its run list, the pages of a small room, the
	// next frame) come in one read instead of one per run, while payload bytes beyond
	// what it holds go straight into the destination pages (readPages).
	in  *bufio.Reader
	hdr [HeaderSize]byte
	// out holds the replies not yet written: a shm chunk's COPIED waits while the next
	// frame is already buffered, so several go in one write (flushBeforeRead).
	out     []byte
	runBuf  []byte
	runs    []ChunkRun
	dsts    [][]byte // the destination pages of the chunk being read, one slice per run
	scratch []byte
	// sliceRuns is runs for a sliced chunk, whose dsts are rows; stage holds a piece of
	// them on its way there (slices.go).
	sliceRuns []SliceRun
	stage     []byte
	// shm is the connection's proven prefill mappings (shm_receiver.go).
	shm rxShm
	// pending holds the rooms that received a chunk on this connection; if it breaks, the
	// live ones fail with transfer_error.
	pending map[*rxRoom]struct{}
}

func (c *rxConn) serve() error {
	r := c.r
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.HandshakeTimeout)
	c.raw.SetDeadline(time.Now().Add(r.cfg.HandshakeTimeout))
	conn, err := r.cfg.Auth.Server(ctx, c.raw)
	cancel()
	if err != nil {
		r.log.Warn("data connection refused", zap.Stringer("remote", c.raw.RemoteAddr()), zap.Error(err))
		return fmt.Errorf("%w: %w", ErrAuth, err)
	}
	c.c = conn
	c.c.SetDeadline(time.Time{})
	c.in = bufio.NewReaderSize(conn, readBufBytes)
	r.log.Debug("data connection accepted", zap.Stringer("remote", c.raw.RemoteAddr()))
	for {
		if err := c.readFull(c.hdr[:]); err != nil {
			return err
		}
		h, err := DecodeHeader(c.hdr[:])
		if err != nil {
			// The stream cannot be resynchronised after a bad header.
			r.refuse(RefusedBadFrame, c.raw.RemoteAddr(), fmt.Errorf("bad frame header: %w", err))
			return err
		}
		switch h.Type {
		case FrameChunk:
			err = c.chunk(&h)
		case FrameDone:
			err = c.done(&h)
		case FramePing:
			err = c.reply(&Header{Type: FramePong})
		case FrameShmOffer:
			err = c.shmOffer(&h)
		default:
			err = fmt.Errorf("%w: %d from sender", ErrBadFrameType, h.Type)
			r.refuse(RefusedBadFrame, c.raw.RemoteAddr(), err, zap.Inline(h.Key()))
		}
		if err != nil {
			return err
		}
	}
}

// readFull reads exactly len(p) bytes under the transfer-idle deadline.
func (c *rxConn) readFull(p []byte) error {
	if err := c.flushBeforeRead(len(p)); err != nil {
		return err
	}
	c.c.SetReadDeadline(time.Now().Add(c.r.cfg.IdleTimeout))
	_, err := io.ReadFull(c.in, p)
	return err
}

// readRunList reads h's run list of entry bytes per entry into the connection's buffer.
func (c *rxConn) readRunList(h *Header, entry int) ([]byte, error) {
	n := int(h.NumRuns) * entry
	if cap(c.runBuf) < n {
		c.runBuf = make([]byte, n)
	}
	return c.runBuf[:n], c.readFull(c.runBuf[:n])
}

// readPages reads exactly len(p) bytes of a payload into p: first what the buffering
// already holds, then straight from the connection whatever the sizes of the reads the
// socket returns. Through the buffering every read short of readBufBytes (the tail of each
// piece, or a socket that hands out less) cost a second copy of the page bytes: 22% of
// decoded's CPU in the demo bench. The next frame's header refills the buffering. It
// returns how many bytes it took from the stream: len(p), or fewer with the error.
func (c *rxConn) readPages(region *Region, p []byte) (int, error) {
	n := 0
	if c.in.Buffered() > 0 {
		n, _ = c.in.Read(p) // buffered bytes only: no read from the connection
	}
	if n == len(p) {
		return n, nil
	}
	if err := c.flushReplies(); err != nil {
		return n, err
	}
	k, err := io.ReadFull(c.c, p[n:])
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return n + k, regionIOError(region, c.r.log, err)
	}
	return n + k, nil
}

// drain reads and discards n bytes; nothing is written to region memory.
func (c *rxConn) drain(n uint64) error {
	for n > 0 {
		k := min(n, uint64(len(c.scratch)))
		if err := c.readFull(c.scratch[:k]); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

func (c *rxConn) discard(n uint64) error {
	c.r.discardedChunks.Add(1)
	c.r.discardedBytes.Add(n)
	return c.drain(n)
}

// reply writes h now, after the replies queued before it (in order).
func (c *rxConn) reply(h *Header) error {
	c.queueReply(h)
	return c.flushReplies()
}

// maxQueuedReplies bounds the COPIED frames held back for one write: their chunks' bytes
// are the sender's budget, so a few chunks' worth (4 of the default 16) wait at most.
const maxQueuedReplies = 4

// queueReply encodes h behind the replies not yet written; flushReplies writes them.
func (c *rxConn) queueReply(h *Header) {
	n := len(c.out)
	c.out = append(c.out, zeroHeader[:]...)
	h.Encode(c.out[n:])
}

// flushReplies writes the queued replies in one write.
func (c *rxConn) flushReplies() error {
	if len(c.out) == 0 {
		return nil
	}
	c.c.SetWriteDeadline(time.Now().Add(c.r.cfg.WriteTimeout))
	_, err := c.c.Write(c.out)
	c.out = c.out[:0]
	return err
}

// flushBeforeRead writes the queued replies when the next n bytes are not all buffered:
// a read that may wait for the sender must not hold back the COPIEDs that give it budget.
func (c *rxConn) flushBeforeRead(n int) error {
	if len(c.out) == 0 || c.in.Buffered() >= n {
		return nil
	}
	return c.flushReplies()
}

func (c *rxConn) result(key Key, reason Reason) error {
	code := codeOK
	if reason != "" {
		code = reason.code()
	}
	return c.reply(&Header{Type: FrameResult, Room: key.Room, Nonce: key.Nonce, Rank: key.Rank, From: key.From, Status: uint32(code)})
}

// reject fails room as invalid, drains the frame's payload and tells the sender.
func (c *rxConn) reject(room *rxRoom, payload uint64, err error) error {
	c.r.refuse(RefusedInvalid, c.raw.RemoteAddr(), err, zap.Inline(room.key))
	c.r.fail(room, ReasonInvalid, err, zap.Stringer("remote", c.raw.RemoteAddr()))
	if err := c.drain(payload); err != nil {
		return err
	}
	return c.result(room.key, ReasonInvalid)
}

func (c *rxConn) chunk(h *Header) error {
	switch h.Flags & (FlagSliced | FlagShm) {
	case FlagSliced:
		return c.slicedChunk(h)
	case FlagShm:
		return c.shmChunk(h)
	case FlagSliced | FlagShm:
		return c.shmSlicedChunk(h)
	}
	r := c.r
	b, err := c.readRunList(h, runSize)
	if err != nil {
		return err
	}
	runs, err := DecodeRuns(c.runs, b, h.NumRuns, h.RunsCRC)
	if err != nil {
		r.refuse(RefusedBadFrame, c.raw.RemoteAddr(), err, zap.Inline(h.Key()))
		return err // a run list that fails its checksum cannot be trusted to delimit the payload
	}
	c.runs = runs
	room := r.lookup(h.Key())
	if room == nil {
		return c.discard(h.PayloadLen)
	}
	room.mu.Lock()
	if room.state != live {
		room.mu.Unlock()
		return c.discard(h.PayloadLen)
	}
	if h.Flags&FlagPayloadCRC == 0 && r.cfg.Checksum == ChecksumCRC32C {
		err = fmt.Errorf("%w: chunk without checksum", ErrRejected)
	} else {
		err = room.claim(h, runs, room.region.Layout())
	}
	room.mu.Unlock()
	if err != nil {
		return c.reject(room, h.PayloadLen, err)
	}
	c.dsts = c.dsts[:0]
	for _, run := range runs {
		dst := room.region.Pages(int(run.Buffer), run.Run)
		if dst == nil {
			// Claimed against a mapping the region no longer serves: the
			// room was fenced before the region was replaced.
			clear(c.dsts)
			return c.discard(h.PayloadLen)
		}
		c.dsts = append(c.dsts, dst)
	}
	return c.land(h, room, c.write)
}

// land reads a claimed chunk's payload into c.dsts with fill (write, or scatter for head
// slices), checks its crc32c and counts its pages as verified.
func (c *rxConn) land(h *Header, room *rxRoom, fill func(*rxRoom, [][]byte, uint32) (uint32, int, error)) error {
	r := c.r
	c.addPending(room)
	crc, n, err := fill(room, c.dsts, 0)
	clear(c.dsts)
	if err == errFenced {
		return c.discard(h.PayloadLen - uint64(n))
	} else if errors.Is(err, ErrRegionFault) {
		return c.faulted(room, h.PayloadLen-uint64(n), err)
	} else if err != nil {
		return err
	}
	if h.Flags&FlagPayloadCRC != 0 && crc != h.PayloadCRC {
		err := fmt.Errorf("%w: seq %d", ErrChecksum, h.Seq)
		r.refuse(RefusedChecksum, c.raw.RemoteAddr(), err, zap.Inline(room.key))
		r.fail(room, ReasonChecksum, err)
		return c.result(room.key, ReasonChecksum)
	}
	room.mu.Lock()
	room.verified += int64(h.Pages)
	room.mu.Unlock()
	r.events.Progress(room.key, int64(h.PayloadLen))
	return nil
}

var errFenced = errors.New("room fenced")

// write reads the bytes of dsts, in order, from the connection straight into them, one
// piece of at most PieceBytes (spanning slices: a chunk of many small runs is one piece) at
// a time, each piece only while the room is live (the fence protocol, see rxRoom). It
// returns the crc32c updated over what it wrote and the bytes read, or errFenced with the
// rest unread, or an ErrRegionFault with the bytes taken from the stream so far.
func (c *rxConn) write(room *rxRoom, dsts [][]byte, crc uint32) (uint32, int, error) {
	n, i, off := 0, 0, 0
	for {
		for i < len(dsts) && off == len(dsts[i]) {
			i, off = i+1, 0
		}
		if i == len(dsts) {
			return crc, n, nil
		}
		if !c.join(room) {
			return crc, n, errFenced
		}
		var err error
		// taken is how much of p the stream gave up before a fault: a fault copying
		// out of the read buffering leaves its bytes there, one in the checksum pass
		// comes after all of p was read.
		taken := 0
		fault := touchRegion(room.region, c.r.log, c.r.beforeTouch, func() {
			for left := c.r.cfg.PieceBytes; left > 0 && i < len(dsts); {
				p := dsts[i][off:]
				p = p[:min(len(p), left)]
				taken = 0
				if taken, err = c.readPages(room.region, p); err != nil {
					break
				}
				crc = crc32.Update(crc, castagnoli, p)
				n, left, off, taken = n+len(p), left-len(p), off+len(p), 0
				for i < len(dsts) && off == len(dsts[i]) {
					i, off = i+1, 0
				}
			}
		})
		if fault != nil {
			err = fault
		}
		if errors.Is(err, ErrRegionFault) {
			n += taken // the caller drains the rest of the frame
		}
		if c.leave(room) {
			c.r.letGoFence(room)
		}
		if err != nil {
			return crc, n, err
		}
	}
}

// join starts this connection's write of one piece into room, if the room is live (the
// fence protocol, see rxRoom); leave ends it.
func (c *rxConn) join(room *rxRoom) bool {
	room.mu.Lock()
	defer room.mu.Unlock()
	if room.state != live {
		return false
	}
	room.writing = append(room.writing, c)
	// Armed under mu, so a fence's interrupt (which sets it to now, under mu) is never
	// overwritten by the read it interrupts.
	c.c.SetReadDeadline(time.Now().Add(c.r.cfg.IdleTimeout))
	return true
}

// leave ends this connection's write into room and reports whether it was the last one a
// pending fence waited for.
func (c *rxConn) leave(room *rxRoom) bool {
	room.mu.Lock()
	defer room.mu.Unlock()
	if i := slices.Index(room.writing, c); i >= 0 {
		room.writing = slices.Delete(room.writing, i, i+1)
	}
	if len(room.writing) > 0 || room.grace == nil {
		return false
	}
	room.grace.Stop()
	room.grace = nil
	return true
}

func (c *rxConn) done(h *Header) error {
	r := c.r
	room := r.lookup(h.Key())
	if room == nil {
		// Ended and forgotten here, or never expected: then the sender's plan
		// of the room's streams is not this side's, and expected says what
		// this side waits for instead.
		r.refuse(RefusedUnknownRoom, c.raw.RemoteAddr(), fmt.Errorf("%w: done for a stream not expected here", ErrRejected),
			zap.Inline(h.Key()), zap.Stringer("expected", expectedBeside{r, h.Key()}))
		if err := c.discard(h.PayloadLen); err != nil {
			return err
		}
		return c.result(h.Key(), ReasonFenced)
	}
	room.mu.Lock()
	if room.state != live {
		reason := room.reason
		if room.state != failed {
			reason = ReasonFenced
		}
		room.mu.Unlock()
		if err := c.discard(h.PayloadLen); err != nil {
			return err
		}
		return c.result(room.key, reason)
	}
	var aux []byte
	if room.auxRow >= 0 {
		aux = room.region.AuxRow(room.auxRow)
	}
	var err error
	switch {
	case h.Flags&FlagPayloadCRC == 0 && r.cfg.Checksum == ChecksumCRC32C:
		err = fmt.Errorf("%w: done without checksum", ErrRejected)
	case h.Seq != room.nextSeq || int64(h.Pages) != room.total || room.claimed != room.total:
		err = fmt.Errorf("%w: done after %d chunks and %d pages, room has %d chunks, %d of %d pages",
			ErrRejected, h.Seq, h.Pages, room.nextSeq, room.claimed, room.total)
	case room.verified != room.total || len(room.writing) > 0:
		err = fmt.Errorf("%w: done while pages are still landing", ErrRejected)
	case h.PayloadLen != uint64(len(aux)):
		err = fmt.Errorf("%w: aux row of %d bytes, want %d", ErrAuxMismatch, h.PayloadLen, len(aux))
	}
	room.mu.Unlock()
	if err != nil {
		return c.reject(room, h.PayloadLen, err)
	}
	c.addPending(room)
	crc, n, err := c.write(room, [][]byte{aux}, 0)
	if err == errFenced {
		return c.discard(uint64(len(aux) - n))
	} else if errors.Is(err, ErrRegionFault) {
		return c.faulted(room, uint64(len(aux)-n), err)
	} else if err != nil {
		return err
	}
	if h.Flags&FlagPayloadCRC != 0 && crc != h.PayloadCRC {
		err := fmt.Errorf("%w: aux row", ErrChecksum)
		r.refuse(RefusedChecksum, c.raw.RemoteAddr(), err, zap.Inline(room.key))
		r.fail(room, ReasonChecksum, err)
		return c.result(room.key, ReasonChecksum)
	}
	room.mu.Lock()
	ok := room.finish(completed, "")
	room.mu.Unlock()
	if !ok {
		return c.result(room.key, ReasonFenced) // fenced while the aux row landed
	}
	delete(c.pending, room)
	r.log.Debug("room complete", zap.Inline(room.key))
	r.events.Complete(room.key)
	return c.result(room.key, "")
}

// faulted fails room with transfer_error after its destination pages faulted (the region
// file was truncated under them), drains the left bytes of its frame and tells the sender,
// so the connection and its other rooms go on.
func (c *rxConn) faulted(room *rxRoom, left uint64, err error) error {
	c.r.fail(room, ReasonTransferError, err)
	if err := c.drain(left); err != nil {
		return err
	}
	return c.result(room.key, ReasonTransferError)
}

func (c *rxConn) addPending(room *rxRoom) {
	if len(c.pending) >= 1024 {
		for p := range c.pending {
			p.mu.Lock()
			if p.state != live {
				delete(c.pending, p)
			}
			p.mu.Unlock()
		}
	}
	c.pending[room] = struct{}{}
}

// failPending fails, with transfer_error, the live rooms that received bytes on this
// connection. Rooms that never used it are not touched.
func (c *rxConn) failPending(cause error) {
	if cause == nil || errors.Is(cause, io.EOF) {
		cause = ErrConnBroken
	}
	for room := range c.pending {
		c.r.fail(room, ReasonTransferError, fmt.Errorf("%w: %w", ErrConnBroken, cause))
	}
	if len(c.pending) > 0 || !errors.Is(cause, ErrConnBroken) {
		c.r.log.Debug("data connection closed", zap.Stringer("remote", c.raw.RemoteAddr()), zap.Error(cause))
	}
}
