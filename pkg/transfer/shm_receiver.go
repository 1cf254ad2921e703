package transfer

import (
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sync/atomic"

	"go.uber.org/zap"
)

// shmCounters are a side's same-host negotiation counters (pdlink_shm_*).
type shmCounters struct {
	accepted  atomic.Uint64
	fallbacks [maxShmFallback + 1]atomic.Uint64
	conns     atomic.Int64 // connections with at least one accepted offer now
	copied    atomic.Uint64
	reoffers  atomic.Uint64
}

// ShmStats is a side's same-host counters: offers accepted, refusals by reason (the
// pdlink_shm_fallback_total reason label), data connections moving pages by shared
// memory now, (decode) the page bytes copied from prefill mappings, and (prefill) the
// offers made again for a file already answered on the connection because the engine
// registered it again (Mapping.Renew).
type ShmStats struct {
	Accepted    uint64
	Fallbacks   map[string]uint64
	ShmConns    int64
	CopiedBytes uint64
	Reoffers    uint64
}

// shmTotals are every Sender's (prefill) and Receiver's (decode) counters in the process,
// what the daemons export (one data plane per daemon; tests read their instance's).
var shmTotals = struct{ prefill, decode shmCounters }{}

// ShmTotals returns the process's same-host counters of one side: every Sender's
// (decode false) or every Receiver's (decode true).
func ShmTotals(decode bool) ShmStats {
	if decode {
		return shmTotals.decode.stats()
	}
	return shmTotals.prefill.stats()
}

// add applies count to this instance's counters and to the process's total.
func (s *shmCounters) add(total *shmCounters, count func(*shmCounters)) {
	count(s)
	count(total)
}

func (s *shmCounters) stats() ShmStats {
	out := ShmStats{Accepted: s.accepted.Load(), Fallbacks: map[string]uint64{}, ShmConns: s.conns.Load(), CopiedBytes: s.copied.Load(),
		Reoffers: s.reoffers.Load()}
	for _, f := range AllShmFallbacks() {
		out.Fallbacks[f.String()] = s.fallbacks[f].Load()
	}
	return out
}

// ShmStats returns the receiver's same-host counters.
func (r *Receiver) ShmStats() ShmStats { return r.shm.stats() }

// rxShm is a connection's proven prefill mappings by offer id (owned by its goroutine).
type rxShm struct {
	byOffer map[uint32]*shmSource
	// srcs are the source bytes of the chunk being copied, in the order of rxConn.dsts'
	// bytes: the same pieces for whole pages, rows cut apart on one side for head slices.
	srcs      [][]byte
	runs      []ShmRun
	sliceRuns []ShmSliceRun
	checked   []*shmSource // the sources the chunk being landed copies from, each once: stat'ed before the copy
	counted   bool         // this connection counts in shmCounters.conns
}

type shmSource struct {
	rank Rank
	m    *Mapping
	// job is m's pre-faulting by the Receiver's populate worker (nil when none runs), which
	// then decides when m is unmapped.
	job *populateJob
	// gone is why the file was found deleted, replaced or truncated at a chunk's stat; m is
	// then unmapped and nil. The offer stays known so that the chunks prefill announced on
	// it before it noticed fail with that stat's reason, not as chunks naming no offer,
	// until prefill offers the rank's file again (a new generation, or the same file
	// registered again once whole: Mapping.Renew), which retires it like any older offer.
	gone error
}

// shmOffer answers a SHM_OFFER: the mapping proven, or the fallback reason. An offer that
// does not parse breaks the connection, like any malformed frame.
func (c *rxConn) shmOffer(h *Header) error {
	r := c.r
	buf := make([]byte, h.PayloadLen)
	if err := c.readFull(buf); err != nil {
		return err
	}
	if crc32.Checksum(buf, castagnoli) != h.PayloadCRC {
		err := fmt.Errorf("%w: payload checksum", ErrBadShmOffer)
		r.refuse(RefusedBadFrame, c.raw.RemoteAddr(), err, zap.Uint16("prefill_rank", h.Rank.TP))
		return err
	}
	o, err := DecodeShmOffer(buf)
	if err != nil {
		r.refuse(RefusedBadFrame, c.raw.RemoteAddr(), err, zap.Uint16("prefill_rank", h.Rank.TP))
		return err
	}
	if c.shm.byOffer == nil {
		c.shm.byOffer = map[uint32]*shmSource{}
	}
	// A new offer for the rank retires the older ones: this goroutine is the only reader of
	// them, and no later chunk may copy from a file prefill no longer serves.
	for id, s := range c.shm.byOffer {
		if s.rank == h.Rank {
			s.close()
			delete(c.shm.byOffer, id)
		}
	}
	code := ShmDisabled
	if r.cfg.Transport != KindTCP {
		var m *Mapping
		m, code, err = openShmSource(o)
		if code == ShmAccepted {
			c.shm.byOffer[h.Seq] = &shmSource{rank: h.Rank, m: m, job: r.startPopulate(m)}
		}
	}
	if code == ShmAccepted {
		r.shm.add(&shmTotals.decode, func(c *shmCounters) { c.accepted.Add(1) })
		if !c.shm.counted {
			c.shm.counted = true
			r.shm.add(&shmTotals.decode, func(c *shmCounters) { c.conns.Add(1) })
		}
		r.log.Info("same-host pages accepted", zap.Stringer("remote", c.raw.RemoteAddr()), zap.Uint16("prefill_rank", h.Rank.TP),
			zap.String("region", o.ID.Path), zap.Uint64("generation", o.ID.Generation))
	} else {
		r.shm.add(&shmTotals.decode, func(c *shmCounters) { c.fallbacks[code].Add(1) })
		r.log.Warn("same-host pages refused, tcp for this rank", zap.Stringer("remote", c.raw.RemoteAddr()),
			zap.Uint16("prefill_rank", h.Rank.TP), zap.String("region", o.ID.Path), zap.String("reason", code.String()), zap.Error(err))
	}
	answer := Header{Type: FrameShmAnswer, Rank: h.Rank, Seq: h.Seq, Status: uint32(code)}
	if code == ShmAccepted {
		answer.Pages = r.shmCaps.Load()
	}
	return c.reply(&answer)
}

// closeShm unmaps the connection's prefill mappings once its goroutine ended.
func (c *rxConn) closeShm() {
	for id, s := range c.shm.byOffer {
		s.close()
		delete(c.shm.byOffer, id)
	}
	if c.shm.counted {
		c.shm.counted = false
		c.r.shm.add(&shmTotals.decode, func(c *shmCounters) { c.conns.Add(-1) })
	}
}

// copied tells the sender the shm chunk's pages are copied, refused or discarded: its
// bytes go back to the sender's budget. The frame is queued and goes out with the next
// reply, before the next read that may wait, or once maxQueuedReplies wait: one write per
// chunk was 11-16% of decode's CPU.
func (c *rxConn) copied(h *Header) error {
	c.queueReply(&Header{Type: FrameCopied, Room: h.Room, Nonce: h.Nonce, Rank: h.Rank, From: h.From, Seq: h.Seq})
	if len(c.out) >= maxQueuedReplies*HeaderSize {
		return c.flushReplies()
	}
	return nil
}

// shmChunk lands a shm chunk: the same claim as a TCP chunk's, then the copy from the
// proven source mapping (copyShmChunk). Every shm chunk is answered with COPIED.
func (c *rxConn) shmChunk(h *Header) error {
	r := c.r
	b, err := c.readRunList(h, shmRunSize)
	if err != nil {
		return err
	}
	runs, err := DecodeShmRuns(c.shm.runs, b, h.NumRuns, h.RunsCRC)
	if err != nil {
		r.refuse(RefusedBadFrame, c.raw.RemoteAddr(), err, zap.Inline(h.Key()))
		return err
	}
	c.shm.runs = runs
	room := r.lookup(h.Key())
	if room == nil {
		return c.shmDiscard(h)
	}
	layout := room.region.Layout()
	// The claim of a TCP chunk, over the destination runs, for the bytes they will copy.
	c.runs = c.runs[:0]
	claimed := *h
	claimed.PayloadLen = 0
	for _, run := range runs {
		c.runs = append(c.runs, run.ChunkRun)
		if uint64(run.Buffer) < uint64(len(layout.Buffers)) {
			claimed.PayloadLen += uint64(run.Count) * uint64(layout.Buffers[run.Buffer].ItemLen)
		}
	}
	if ok, err := c.shmClaim(h, room, func() error { return room.claim(&claimed, c.runs, layout) }); !ok {
		return err
	}
	for _, run := range runs {
		src, reason, err := c.shmSource(run.Offer)
		if err != nil {
			return c.shmRefuse(room, h, reason, err)
		}
		spec := layout.Buffers[run.Buffer] // claim checked the buffer
		s, err := sourcePages(src.m, run.Buffer, Run{Start: run.SrcStart, Count: run.Count}, spec.ItemLen)
		if err != nil {
			return c.shmRefuse(room, h, ReasonInvalid, err)
		}
		dst := room.region.Pages(int(run.Buffer), run.Run)
		if dst == nil { // claimed against a mapping since replaced: the room is fenced
			return c.shmDiscard(h)
		}
		c.dsts, c.shm.srcs = append(c.dsts, dst), append(c.shm.srcs, s)
	}
	return c.copyShmChunk(h, room, claimed.PayloadLen)
}

// shmClaim runs claim (the chunk's claim of its room's pages or slices) under the room's
// lock, as a TCP chunk's: unless the room is no longer live (the chunk is discarded), and
// refusing a chunk without the checksum decode requires or whose claim fails (the room
// fails invalid). false: the chunk was answered, with the answer's error.
func (c *rxConn) shmClaim(h *Header, room *rxRoom, claim func() error) (bool, error) {
	room.mu.Lock()
	if room.state != live {
		room.mu.Unlock()
		return false, c.shmDiscard(h)
	}
	var err error
	if h.Flags&FlagPayloadCRC == 0 && c.r.cfg.Checksum == ChecksumCRC32C {
		err = fmt.Errorf("%w: chunk without checksum", ErrRejected)
	} else {
		err = claim()
	}
	room.mu.Unlock()
	if err != nil {
		return false, c.shmRefuse(room, h, ReasonInvalid, err)
	}
	c.shmChunkEnded()
	return true, nil
}

// shmSource is the proven source of offer for the chunk being landed, added to the
// sources its copy stats (rxShm.checked, each once); else why the chunk fails: an offer
// never made or retired by a newer one (invalid), or one whose file a stat found gone
// (that stat's reason).
func (c *rxConn) shmSource(offer uint32) (*shmSource, Reason, error) {
	src := c.shm.byOffer[offer]
	switch {
	case src == nil:
		return nil, ReasonInvalid, fmt.Errorf("%w: offer %d", ErrShmSource, offer)
	case src.gone != nil:
		return nil, goneReason(src.gone), src.gone
	}
	if !slices.Contains(c.shm.checked, src) {
		c.shm.checked = append(c.shm.checked, src)
	}
	return src, "", nil
}

// copyShmChunk ends landing a claimed shm chunk whose pieces are in c.shm.srcs and
// c.dsts, whole pages or head slices alike: each prefill file the chunk copies from is
// stat'ed once (one stat per source per chunk, not per run: a chunk of 16 scattered runs
// spent a fifth of decode's CPU in stat), so a file deleted, replaced or truncated since
// it was proven is never copied from; then the copy, piece by piece under the fence
// protocol, its crc32c over the destination bytes compared with prefill's. landed is the
// bytes the chunk lands (the progress and copied counters). Every outcome answers COPIED.
func (c *rxConn) copyShmChunk(h *Header, room *rxRoom, landed uint64) error {
	r := c.r
	for _, src := range c.shm.checked {
		if r.beforeCheck != nil {
			r.beforeCheck()
		}
		if err := src.m.Check(); err != nil {
			if isRegionGone(err) {
				src.close()
				src.gone = err
			}
			return c.shmRefuse(room, h, goneReason(err), err)
		}
	}
	c.addPending(room)
	crc, err := c.copyPages(room)
	c.shmChunkEnded()
	switch {
	case err == errFenced:
		return c.shmDiscard(h)
	case errors.Is(err, ErrRegionFault):
		r.fail(room, ReasonTransferError, err)
		if err := c.copied(h); err != nil {
			return err
		}
		return c.result(room.key, ReasonTransferError)
	case h.Flags&FlagPayloadCRC != 0 && crc != h.PayloadCRC:
		return c.shmRefuse(room, h, ReasonChecksum, fmt.Errorf("%w: seq %d (shm)", ErrChecksum, h.Seq))
	}
	room.mu.Lock()
	room.verified += int64(h.Pages)
	room.mu.Unlock()
	r.shm.add(&shmTotals.decode, func(c *shmCounters) { c.copied.Add(landed) })
	r.events.Progress(room.key, int64(landed))
	return c.copied(h)
}

// shmChunkEnded lets go of the landed chunk's pieces and sources (no reference into a
// mapping outlives its chunk).
func (c *rxConn) shmChunkEnded() {
	clear(c.dsts)
	clear(c.shm.srcs)
	clear(c.shm.checked)
	c.dsts, c.shm.srcs, c.shm.checked = c.dsts[:0], c.shm.srcs[:0], c.shm.checked[:0]
}

// shmDiscard answers a shm chunk that copies nothing (its room unknown, ended, or fenced
// mid-copy) with COPIED.
func (c *rxConn) shmDiscard(h *Header) error {
	c.shmChunkEnded()
	c.r.discardedChunks.Add(1)
	return c.copied(h)
}

// goneReason is the reason a chunk whose prefill file failed its stat fails with: the file
// replaced at its path or removed is prefill's region_replaced, as when prefill notices it
// itself; a truncated file (the same inode, shorter) or a stat that failed otherwise is
// transfer_error, as a fault mid-copy is.
func goneReason(err error) Reason {
	if errors.Is(err, ErrRegionReplaced) {
		return ReasonRegionReplaced
	}
	return ReasonTransferError
}

// close lets go of the source once (a gone source was let go already): unmapped now, or
// by the populate worker once its step on the mapping ends.
func (s *shmSource) close() {
	switch {
	case s.m == nil:
	case s.job != nil:
		s.job.drop()
	default:
		s.m.Close()
	}
	s.m, s.job = nil, nil
}

// shmRefuse fails room with reason, answers the chunk COPIED (nothing more of it is read)
// and the room's RESULT. A chunk that does not match its room (invalid) or whose copy
// fails its crc32c is a refusal, counted and logged as a TCP chunk's; a prefill file
// found gone is not the frame's fault.
func (c *rxConn) shmRefuse(room *rxRoom, h *Header, reason Reason, err error) error {
	c.shmChunkEnded()
	switch reason {
	case ReasonInvalid:
		c.r.refuse(RefusedInvalid, c.raw.RemoteAddr(), err, zap.Inline(room.key), zap.Bool("shm", true))
	case ReasonChecksum:
		c.r.refuse(RefusedChecksum, c.raw.RemoteAddr(), err, zap.Inline(room.key), zap.Bool("shm", true))
	}
	c.r.fail(room, reason, err)
	if err := c.copied(h); err != nil {
		return err
	}
	return c.result(room.key, reason)
}

// copyPages copies c.shm.srcs into c.dsts and returns the crc32c of the destination
// bytes. A chunk of at least CopyWorkers pieces is split into that many contiguous parts,
// each copied by its own goroutine (the connection's and helpers that end before this
// returns, so no read of the source outlives its COPIED): one core that copies and sums
// spends about 1.7x a plain copy's CPU, so a host with spare cores can split it. Each part's crc is
// combined in order into the chunk's. errFenced: the room was fenced between pieces; a
// fault on either mapping is an ErrRegionFault (either wins over errFenced).
func (c *rxConn) copyPages(room *rxRoom) (uint32, error) {
	total := 0
	for _, d := range c.dsts {
		total += len(d)
	}
	workers := min(c.r.cfg.CopyWorkers, total/c.r.cfg.PieceBytes)
	if workers < 2 {
		return c.copyRange(room, 0, total)
	}
	type part struct {
		crc uint32
		err error
	}
	parts := make([]part, workers)
	// On cache-line edges of the chunk's order, so no line of whole pages is written by two
	// cores; a head slice's rows need not start on one (a shared line costs time only).
	bounds := func(k int) int {
		if k == workers {
			return total
		}
		return total * k / workers &^ 63
	}
	done := make(chan struct{}, workers-1)
	for k := 1; k < workers; k++ {
		go func() {
			defer func() { done <- struct{}{} }()
			parts[k].crc, parts[k].err = c.copyRange(room, bounds(k), bounds(k+1))
		}()
	}
	parts[0].crc, parts[0].err = c.copyRange(room, 0, bounds(1))
	for k := 1; k < workers; k++ {
		<-done
	}
	crc, err := parts[0].crc, parts[0].err
	for k := 1; k < workers; k++ {
		crc = crc32cCombine(crc, parts[k].crc, int64(bounds(k+1)-bounds(k)))
		if e := parts[k].err; e != nil && (err == nil || err == errFenced) {
			err = e
		}
	}
	return crc, err
}

// copyBlock is how much of a piece is copied before its crc32c is summed: the bytes just
// written are summed while they are still in the first-level cache.
const copyBlock = 32 << 10

// copyRange copies bytes [from, to) of the chunk (c.shm.srcs end to end into c.dsts end
// to end) one piece (PieceBytes) at a time, each only while the room is live and inside
// touchRegion (a fault on either mapping is an ErrRegionFault), and returns their crc32c,
// summed right after each block's copy, over the destination bytes in the chunk's order
// (a TCP chunk's payload order). The two lists are walked apart: for head slices one side
// is whole pages and the other a row slice per token, and each copy is as long as both
// sides' current pieces allow, so a slice that is the whole row on both sides is one
// memmove per run. The sum is taken over each contiguous destination stretch of up to
// copyBlock bytes, not per copy: gathering 512-byte rows into whole pages (2 -> 4) spent
// 0.50-0.54 receiver CPU-s per GB summing row by row, 0.27-0.34 by stretch
// (BenchmarkShmSlicedTransfer, same runs). It may run on a copy worker's goroutine: join
// and leave count each worker as a writer of the room, so a fence waits for all of them.
func (c *rxConn) copyRange(room *rxRoom, from, to int) (uint32, error) {
	var crc uint32
	dsts, srcs := c.dsts, c.shm.srcs
	d, doff := seekPieces(dsts, from)
	s, soff := seekPieces(srcs, from)
	sum := c.r.cfg.Checksum == ChecksumCRC32C
	for pos := from; pos < to; {
		if !c.join(room) {
			return crc, errFenced
		}
		fault := touchRegion(room.region, c.r.log, c.r.beforeTouch, func() {
			span := doff // where the destination bytes copied and not yet summed start
			for left := c.r.cfg.PieceBytes; left > 0 && pos < to; {
				b := dsts[d][doff:]
				b = b[:min(len(b), len(srcs[s])-soff, left, to-pos, copyBlock-(doff-span))]
				copy(b, srcs[s][soff:soff+len(b)])
				left, pos, doff = left-len(b), pos+len(b), doff+len(b)
				if doff == len(dsts[d]) || doff-span == copyBlock || left == 0 || pos == to {
					if sum {
						crc = crc32.Update(crc, castagnoli, dsts[d][span:doff])
					}
					span = doff
				}
				if doff == len(dsts[d]) {
					d, doff, span = d+1, 0, 0
				}
				if soff += len(b); soff == len(srcs[s]) {
					s, soff = s+1, 0
				}
			}
		})
		if c.leave(room) {
			c.r.letGoFence(room)
		}
		if fault != nil {
			return crc, fault
		}
	}
	return crc, nil
}

// seekPieces is the piece of pieces (end to end) that holds byte at, and at's offset in it.
func seekPieces(pieces [][]byte, at int) (int, int) {
	i := 0
	for i < len(pieces) && at >= len(pieces[i]) {
		at -= len(pieces[i])
		i++
	}
	return i, at
}
