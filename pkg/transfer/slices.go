package transfer

import (
	"fmt"
	"hash/crc32"

	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/pagelist"
	"github.com/pdlink/pdlink/pkg/rankmap"
)

// Head slices: MHA between different TP sizes (see doc.go, "Head slices"). A stream from
// prefill rank s to decode rank d carries the copies rankmap gives for the pair
// (Mapping.CopiesFrom(s, d)); both ends are told them (Stream.Copies, Expectation.Copies)
// and every chunk entry names its copy, so the receiver checks each against what it
// expects before a byte lands.

// copiesByBuffer checks a stream's copies against the local layout l (the source side's
// rows when dst is false, the destination's when true) and groups them by buffer. Copies of
// one buffer must not overlap on the destination side.
func copiesByBuffer(copies []rankmap.Copy, l Layout, dst bool) ([][]rankmap.Copy, error) {
	out := make([][]rankmap.Copy, len(l.Buffers))
	for _, c := range copies {
		if err := checkCopy(c, l, dst); err != nil {
			return nil, err
		}
		for _, o := range out[c.Buffer] {
			if c.DstHead < o.DstHead+o.Heads && o.DstHead < c.DstHead+c.Heads {
				return nil, fmt.Errorf("%w: buffer %d heads [%d,+%d) and [%d,+%d) overlap",
					ErrBadSlice, c.Buffer, c.DstHead, c.Heads, o.DstHead, o.Heads)
			}
		}
		out[c.Buffer] = append(out[c.Buffer], c)
	}
	return out, nil
}

// checkCopy checks one copy on its own and against the local side's page size.
func checkCopy(c rankmap.Copy, l Layout, dst bool) error {
	const most = maxHeadField
	in := func(v, lo int) bool { return v >= lo && v <= most }
	if c.Buffer < 0 || c.Buffer >= len(l.Buffers) {
		return fmt.Errorf("%w: copy of buffer %d, layout has %d", ErrBadSlice, c.Buffer, len(l.Buffers))
	}
	if !in(c.Heads, 1) || !in(c.HeadBytes, 1) || !in(c.PageTokens, 1) || !in(c.SrcHead, 0) || !in(c.DstHead, 0) ||
		!in(c.SrcRow, 1) || !in(c.DstRow, 1) ||
		(c.SrcHead+c.Heads)*c.HeadBytes > c.SrcRow || (c.DstHead+c.Heads)*c.HeadBytes > c.DstRow {
		return fmt.Errorf("%w: buffer %d copy %+v", ErrBadSlice, c.Buffer, c)
	}
	item, side := int64(c.SrcItemLen()), "source"
	if dst {
		item, side = int64(c.DstItemLen()), "destination"
	}
	if got := l.Buffers[c.Buffer].ItemLen; got != item {
		return fmt.Errorf("%w: buffer %d %s page of %d bytes, the copy's is %d", ErrBadSlice, c.Buffer, side, got, item)
	}
	return nil
}

// sliceRunOf is the wire entry of copy c over destination pages run of buffer b.
func sliceRunOf(c rankmap.Copy, run Run) SliceRun {
	return SliceRun{ChunkRun: ChunkRun{Buffer: uint32(c.Buffer), Run: run}, SrcHead: uint32(c.SrcHead),
		DstHead: uint32(c.DstHead), Heads: uint32(c.Heads), HeadBytes: uint32(c.HeadBytes), RowBytes: uint32(c.DstRow)}
}

// matchSlice is the index among copies of the one entry r names, or -1.
func matchSlice(copies []rankmap.Copy, r SliceRun) int {
	for k, c := range copies {
		if uint32(c.SrcHead) == r.SrcHead && uint32(c.DstHead) == r.DstHead && uint32(c.Heads) == r.Heads &&
			uint32(c.HeadBytes) == r.HeadBytes && uint32(c.DstRow) == r.RowBytes {
			return k
		}
	}
	return -1
}

// sliceRows appends to out the slice's bytes of count consecutive pages starting at
// pages (count*row*PageTokens bytes), in wire order: page by page, token by token. A slice
// that is the whole row is the pages themselves, one entry; otherwise one entry per token.
func sliceRows(out [][]byte, pages []byte, count int64, row, head, n, tokens int) [][]byte {
	if head == 0 && n == row {
		return append(out, pages)
	}
	item := row * tokens
	for p := range int(count) {
		for t := range tokens {
			off := p*item + t*row + head
			out = append(out, pages[off:off+n:off+n])
		}
	}
	return out
}

// pairs is the stream's count of (page, slice) pairs: its pages, or each buffer's pages
// times its copies for a sliced stream.
func (j *job) pairs() int64 {
	if j.copies == nil {
		return j.pages
	}
	var n int64
	for b, cs := range j.copies {
		n += j.dstPages[b] * int64(len(cs))
	}
	return n
}

// planSlicedChunks is planChunks for a sliced stream: per buffer, per copy, the pieces'
// segments become SliceRuns, and the payload is each page's slice gathered by the write's
// iovec from the source rows (one iovec entry per token unless the copy reads whole
// source pages), so the wire carries exactly the bytes the destination takes.
func (s *Sender) planSlicedChunks(w *piece) ([]chunkPlan, bool) {
	cfg := &s.cfg
	region := w.j.region
	layout := region.Layout()
	if len(w.segs) > len(layout.Buffers) {
		return nil, false
	}
	var plans []chunkPlan
	c := chunkPlan{iov: [][]byte{nil}, sliced: true}
	flush := func() {
		plans = append(plans, c)
		c = chunkPlan{iov: [][]byte{nil}, sliced: true}
	}
	for b, segs := range w.segs {
		for _, cp := range w.j.copies[b] {
			if int64(cp.SrcItemLen()) != layout.Buffers[b].ItemLen {
				return nil, false // planned against a layout the region no longer serves
			}
			per := int64(cp.PageTokens * cp.Heads * cp.HeadBytes)
			i, off := 0, int32(0)
			for i < len(segs) {
				if len(c.slices) == pagelist.MaxRuns {
					flush()
				}
				seg := segs[i]
				n := min(int64(seg.Count-off), (cfg.MaxChunkBytes-c.bytes)/per, pagelist.MaxPages-c.pages)
				if n <= 0 {
					if c.bytes > 0 {
						flush()
						continue
					}
					n = 1 // a chunk holds at least one page
				}
				src := region.Pages(b, Run{Start: seg.Src + off, Count: int32(n)})
				if src == nil {
					return nil, false
				}
				c.slices = append(c.slices, sliceRunOf(cp, Run{Start: seg.Dst + off, Count: int32(n)}))
				c.srcStarts = append(c.srcStarts, seg.Src+off)
				c.iov = sliceRows(c.iov, src, n, cp.SrcRow, cp.SrcHead*cp.HeadBytes, cp.Heads*cp.HeadBytes, cp.PageTokens)
				c.bytes += n * per
				c.pages += n
				if off += int32(n); off == seg.Count {
					i, off = i+1, 0
				}
			}
		}
	}
	if len(c.slices) > 0 {
		flush()
	}
	return plans, true
}

// entries is the chunk's run-list entry count.
func (c *chunkPlan) entries() uint32 {
	if c.sliced {
		return uint32(len(c.slices))
	}
	return uint32(len(c.runs))
}

// appendRunList appends the chunk's run list in its wire form.
func (c *chunkPlan) appendRunList(dst []byte) []byte {
	if c.sliced {
		return AppendSliceRuns(dst, c.slices)
	}
	return AppendRuns(dst, c.runs)
}

// flags is the chunk's own header flags.
func (c *chunkPlan) flags() uint16 {
	if c.sliced {
		return FlagSliced
	}
	return 0
}

// expectSlices groups an expectation's copies by buffer into room (nil copies: a room of
// whole pages) and returns each buffer's claim multiplier: how many slices each of its
// destination pages takes (1 for whole pages; 0 for a buffer this stream sends nothing
// of).
func expectSlices(room *rxRoom, copies []rankmap.Copy, l Layout) ([]int64, error) {
	mult := make([]int64, len(l.Buffers))
	if len(copies) == 0 {
		for i := range mult {
			mult[i] = 1
		}
		return mult, nil
	}
	byBuf, err := copiesByBuffer(copies, l, true)
	if err != nil {
		return nil, err
	}
	room.sliced = true
	for i, cs := range byBuf {
		room.bufs[i].slices = cs
		mult[i] = int64(len(cs))
	}
	return mult, nil
}

// claimSlices is claim for a sliced chunk: each entry's slice must be one the room expects
// for its buffer, and each (page, slice) pair is claimed once. Under room.mu; nothing is
// written before it succeeds, and a refused chunk claims nothing.
func (room *rxRoom) claimSlices(h *Header, runs []SliceRun, l Layout) error {
	if !room.sliced {
		return fmt.Errorf("%w: head slices for a room of whole pages", ErrSliceMismatch)
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
		k := matchSlice(room.bufs[run.Buffer].slices, run)
		if k < 0 {
			return fmt.Errorf("%w: buffer %d heads [%d,+%d) at head %d of a %d-byte row", ErrSliceMismatch,
				run.Buffer, run.SrcHead, run.Heads, run.DstHead, run.RowBytes)
		}
		c := room.bufs[run.Buffer].slices[k]
		if int64(c.DstItemLen()) != spec.ItemLen {
			return fmt.Errorf("%w: buffer %d pages of %d bytes, the slice's are %d", ErrBadSlice, run.Buffer, spec.ItemLen, c.DstItemLen())
		}
		pages += uint64(run.Count)
		bytes += uint64(run.Count) * uint64(run.sliceBytes(int64(c.PageTokens)))
		if pages > uint64(h.Pages) { // stop early, so the byte sum stays far from overflow
			break
		}
	}
	if pages != uint64(h.Pages) || bytes != h.PayloadLen {
		return fmt.Errorf("%w: slices hold %d pages, %d bytes, header says %d pages, %d bytes",
			ErrRejected, pages, bytes, h.Pages, h.PayloadLen)
	}
	for i, run := range runs {
		b := &room.bufs[run.Buffer]
		p0, ok := b.position(run.Run)
		if !ok {
			room.unclaimSlices(runs[:i])
			return fmt.Errorf("%w: buffer %d pages [%d,%d) are not the room's destination",
				ErrPageOutOfRange, run.Buffer, run.Start, run.end())
		}
		ns, k := int64(len(b.slices)), int64(matchSlice(b.slices, run))
		for p := p0; p < p0+int64(run.Count); p++ {
			bit := p*ns + k
			if b.claimed[bit/64]&(1<<(bit%64)) != 0 {
				b.flipSlice(p0, p-p0, ns, k)
				room.unclaimSlices(runs[:i])
				return fmt.Errorf("%w: buffer %d page %d heads [%d,+%d) sent twice", ErrRunsOverlap,
					run.Buffer, run.Start+int32(p-p0), run.DstHead, run.Heads)
			}
			b.claimed[bit/64] |= 1 << (bit % 64)
		}
	}
	room.nextSeq++
	room.claimed += int64(pages)
	return nil
}

// flipSlice toggles the claim bits of slice k of n positions from p0.
func (b *rxBuf) flipSlice(p0, n, ns, k int64) {
	for p := p0; p < p0+n; p++ {
		bit := p*ns + k
		b.claimed[bit/64] ^= 1 << (bit % 64)
	}
}

// unclaimSlices gives back the pairs of runs that claimSlices reserved for a chunk it then
// refused.
func (room *rxRoom) unclaimSlices(runs []SliceRun) {
	for _, run := range runs {
		b := &room.bufs[run.Buffer]
		p0, _ := b.position(run.Run)
		b.flipSlice(p0, int64(run.Count), int64(len(b.slices)), int64(matchSlice(b.slices, run)))
	}
}

// slicedChunk reads a sliced chunk: its run list, the claim of its (page, slice) pairs,
// then its payload scattered into the destination rows (one row slice per token unless
// the slice fills whole destination pages).
func (c *rxConn) slicedChunk(h *Header) error {
	r := c.r
	b, err := c.readRunList(h, sliceRunSize)
	if err != nil {
		return err
	}
	runs, err := DecodeSliceRuns(c.sliceRuns, b, h.NumRuns, h.RunsCRC)
	if err != nil {
		r.refuse(RefusedBadFrame, c.raw.RemoteAddr(), err, zap.Inline(h.Key()))
		return err // a run list that fails its checks cannot be trusted to delimit the payload
	}
	c.sliceRuns = runs
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
		err = room.claimSlices(h, runs, room.region.Layout())
	}
	room.mu.Unlock()
	if err != nil {
		return c.reject(room, h.PayloadLen, err)
	}
	c.dsts = c.dsts[:0]
	whole := true // every slice fills its destination pages: read them as whole pages
	for _, run := range runs {
		b := &room.bufs[run.Buffer] // slices are read-only once expected
		cp := b.slices[matchSlice(b.slices, run)]
		dst := room.region.Pages(int(run.Buffer), run.Run)
		if dst == nil || int64(len(dst)) != int64(run.Count)*int64(cp.DstItemLen()) {
			// Claimed against a mapping the region no longer serves: the
			// room was fenced before the region was replaced.
			clear(c.dsts)
			return c.discard(h.PayloadLen)
		}
		c.dsts = sliceRows(c.dsts, dst, int64(run.Count), cp.DstRow, cp.DstHead*cp.HeadBytes, cp.Heads*cp.HeadBytes, cp.PageTokens)
		whole = whole && cp.DstContiguous()
	}
	if whole {
		return c.land(h, room, c.write)
	}
	return c.land(h, room, c.scatter)
}

// scatter is write for the rows of head slices: per piece, as many whole rows as a
// PieceBytes staging buffer holds are read from the connection into it in one go, summed
// in one crc32c pass and copied out to their rows, all while the connection is in the
// room's writing list (the fence protocol, see rxRoom). Reading each row where it lands
// (through the read buffering, 32 KiB per read, and a crc32c call per 512-byte row) cost
// the receiver 0.60 s of CPU per GB against whole pages' 0.22 in BenchmarkSlicedTransfer
// (prefill 4 -> decode 2, median of 6 under load); staged, 0.33, and 1.39 -> 1.81 GB/s.
// A row larger than the staging buffer is read in place. It returns what write returns.
func (c *rxConn) scatter(room *rxRoom, rows [][]byte, crc uint32) (uint32, int, error) {
	if len(c.stage) < c.r.cfg.PieceBytes {
		c.stage = make([]byte, c.r.cfg.PieceBytes)
	}
	n := 0
	for i := 0; i < len(rows); {
		if len(rows[i]) > len(c.stage) {
			k, m, err := c.write(room, rows[i:i+1], crc)
			if crc, n = k, n+m; err != nil {
				return crc, n, err
			}
			i++
			continue
		}
		j, k := i, 0
		for j < len(rows) && k+len(rows[j]) <= len(c.stage) {
			k += len(rows[j])
			j++
		}
		if !c.join(room) {
			return crc, n, errFenced
		}
		var err error
		taken := 0
		fault := touchRegion(room.region, c.r.log, c.r.beforeTouch, func() {
			if taken, err = c.readPages(room.region, c.stage[:k]); err != nil {
				return
			}
			crc = crc32.Update(crc, castagnoli, c.stage[:k])
			off := 0
			for ; i < j; i++ {
				off += copy(rows[i], c.stage[off:])
			}
		})
		if fault != nil {
			err = fault
		}
		n += taken // all of it left the stream, landed or not: the caller drains the rest
		if c.leave(room) {
			c.r.letGoFence(room)
		}
		if err != nil {
			return crc, n, err
		}
	}
	return crc, n, nil
}
