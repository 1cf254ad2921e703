package transfer

import (
	"encoding/binary"
	"fmt"

	"go.uber.org/zap"
)

// Head slices on the same-host path (doc.go, "Same-host pages" and "Head slices"). A sliced
// stream's shm chunk (FlagShm|FlagSliced) names, per entry, the destination pages and the
// slice exactly as a TCP sliced chunk does, plus the source pages and the offer they are
// read from; decode then does the gather and the scatter itself in one copy, row slice by
// row slice, in the order a TCP chunk's payload would carry the bytes.

// shmSliceRunSize is the wire size of a ShmSliceRun: a SliceRun's eight u32, then
// src_start and offer.
const shmSliceRunSize = sliceRunSize + 8

// ShmSliceRun is one entry of a sliced shm chunk's run list: the SliceRun's Count
// destination pages from Start, each taking its slice from source page SrcStart+i of the
// same buffer of the region the connection's offer Offer proved. On the wire the
// SliceRun's 32 bytes, then {src_start, offer}.
type ShmSliceRun struct {
	SliceRun
	SrcStart int32
	Offer    uint32
}

// AppendShmSliceRuns appends the wire form of a sliced shm chunk's run list to dst.
func AppendShmSliceRuns(dst []byte, runs []ShmSliceRun) []byte {
	le := binary.LittleEndian
	for _, r := range runs {
		dst = appendSliceRun(dst, r.SliceRun)
		dst = le.AppendUint32(dst, uint32(r.SrcStart))
		dst = le.AppendUint32(dst, r.Offer)
	}
	return dst
}

// DecodeShmSliceRuns parses n sliced shm run-list entries from b (exactly n*40 bytes)
// after checking them against crc: each entry's slice as DecodeSliceRuns checks it, and a
// non-negative source start. It appends to dst[:0] and never panics.
func DecodeShmSliceRuns(dst []ShmSliceRun, b []byte, n uint32, crc uint32) ([]ShmSliceRun, error) {
	if err := checkRunList(b, n, crc, shmSliceRunSize); err != nil {
		return dst[:0], err
	}
	out := dst[:0]
	le := binary.LittleEndian
	for i := 0; i+shmSliceRunSize <= len(b); i += shmSliceRunSize {
		e := b[i : i+shmSliceRunSize]
		r := ShmSliceRun{SliceRun: decodeSliceRun(e), SrcStart: int32(le.Uint32(e[32:])), Offer: le.Uint32(e[36:])}
		if r.Start < 0 || r.Count <= 0 || r.SrcStart < 0 {
			return out[:0], fmt.Errorf("%w: buffer %d run {start %d, count %d, src %d}", ErrEmptyRun, r.Buffer, r.Start, r.Count, r.SrcStart)
		}
		if err := r.checkShape(); err != nil {
			return out[:0], err
		}
		out = append(out, r)
	}
	return out, nil
}

// encodeShmSliceRuns is writeShmChunk's run list for a sliced chunk plan: its slices with
// their source starts and the offer.
func (tc *txConn) encodeShmSliceRuns(c *chunkPlan, offer uint32) {
	tc.shm.sliceRuns = tc.shm.sliceRuns[:0]
	for k, r := range c.slices {
		tc.shm.sliceRuns = append(tc.shm.sliceRuns, ShmSliceRun{SliceRun: r, SrcStart: c.srcStarts[k], Offer: offer})
	}
	tc.meta = AppendShmSliceRuns(append(tc.meta[:0], zeroHeader[:]...), tc.shm.sliceRuns)
}

// shmSlicedChunk lands a sliced shm chunk: the claim of a TCP sliced chunk (claimSlices),
// each entry's source pages checked against the proven mapping, then copyShmChunk's stat
// and copy of every (page, token, slice) from the source rows into the destination rows,
// its crc32c over the destination bytes in wire order. Every such chunk is answered with
// COPIED.
func (c *rxConn) shmSlicedChunk(h *Header) error {
	r := c.r
	if ShmCaps(r.shmCaps.Load())&ShmCapSlices == 0 {
		// Never advertised (a test answering as the previous build, which refused the
		// flag pair in DecodeHeader): the same refusal, so a sender that ignores the
		// answer fails here as it would there.
		err := fmt.Errorf("%w: sliced shm chunk, head slices not offered by this receiver", ErrBadFrameType)
		r.refuse(RefusedBadFrame, c.raw.RemoteAddr(), err, zap.Inline(h.Key()))
		return err
	}
	b, err := c.readRunList(h, shmSliceRunSize)
	if err != nil {
		return err
	}
	runs, err := DecodeShmSliceRuns(c.shm.sliceRuns, b, h.NumRuns, h.RunsCRC)
	if err != nil {
		r.refuse(RefusedBadFrame, c.raw.RemoteAddr(), err, zap.Inline(h.Key()))
		return err
	}
	c.shm.sliceRuns = runs
	room := r.lookup(h.Key())
	if room == nil {
		return c.shmDiscard(h)
	}
	layout := room.region.Layout()
	// claimSlices checks the bytes a TCP sliced chunk would carry against PayloadLen: here
	// they are what the entries copy, the destination page's tokens (item_len / row) times
	// the slice. Past the header's page count the sum stops (claimSlices then refuses the
	// page count), so a hostile count cannot overflow it.
	c.sliceRuns = c.sliceRuns[:0]
	claimed := *h
	claimed.PayloadLen = 0
	var pages uint64
	for _, run := range runs {
		c.sliceRuns = append(c.sliceRuns, run.SliceRun)
		if pages += uint64(run.Count); pages > uint64(h.Pages) || uint64(run.Buffer) >= uint64(len(layout.Buffers)) {
			continue
		}
		tokens := layout.Buffers[run.Buffer].ItemLen / int64(run.RowBytes)
		claimed.PayloadLen += uint64(run.Count) * uint64(run.sliceBytes(tokens))
	}
	if ok, err := c.shmClaim(h, room, func() error { return room.claimSlices(&claimed, c.sliceRuns, layout) }); !ok {
		return err
	}
	for _, run := range runs {
		src, reason, err := c.shmSource(run.Offer)
		if err != nil {
			return c.shmRefuse(room, h, reason, err)
		}
		b := &room.bufs[run.Buffer] // claimSlices checked the buffer and the slice
		cp := b.slices[matchSlice(b.slices, run.SliceRun)]
		s, err := sourcePages(src.m, run.Buffer, Run{Start: run.SrcStart, Count: run.Count}, int64(cp.SrcItemLen()))
		if err != nil {
			return c.shmRefuse(room, h, ReasonInvalid, err)
		}
		dst := room.region.Pages(int(run.Buffer), run.Run)
		if dst == nil || int64(len(dst)) != int64(run.Count)*int64(cp.DstItemLen()) {
			return c.shmDiscard(h) // claimed against a mapping the region no longer serves: the room is fenced
		}
		// Both sides' rows in wire order, page by page, token by token; a side whose
		// slice is its whole row is one piece per run, so whole pages copy in one go.
		hb, width := cp.HeadBytes, cp.Heads*cp.HeadBytes
		c.shm.srcs = sliceRows(c.shm.srcs, s, int64(run.Count), cp.SrcRow, cp.SrcHead*hb, width, cp.PageTokens)
		c.dsts = sliceRows(c.dsts, dst, int64(run.Count), cp.DstRow, cp.DstHead*hb, width, cp.PageTokens)
	}
	return c.copyShmChunk(h, room, claimed.PayloadLen)
}
