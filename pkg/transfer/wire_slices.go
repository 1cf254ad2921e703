package transfer

import (
	"encoding/binary"
	"fmt"
)

// FlagSliced marks a chunk whose run list is SliceRuns: every page of an entry carries one
// head slice (rankmap.Copy) instead of the whole page.
const FlagSliced uint16 = 2

// sliceRunSize is the wire size of a SliceRun: eight u32.
const sliceRunSize = 32

// SliceRun is one entry of a sliced chunk's run list: Count consecutive destination pages
// of buffer Buffer from page Start, each receiving, in every token row of RowBytes bytes,
// Heads heads of HeadBytes bytes at head DstHead, taken from heads [SrcHead, SrcHead+Heads)
// of the sending rank's row. On the wire, after the 12 bytes of a ChunkRun:
//
//	off size field
//	 12    4 src_head   first head within the source rank's row
//	 16    4 dst_head   first head within the destination rank's row
//	 20    4 heads
//	 24    4 head_bytes bytes of one head of one token (head_dim x dtype bytes)
//	 28    4 row_bytes  bytes of one token row on the destination rank
//
// The entry's payload is, per page, page by page, token after token, the slice's
// Heads*HeadBytes bytes (PageTokens = the destination item_len / RowBytes): exactly the
// bytes the slice moves, so neither side ships a head the other does not take.
type SliceRun struct {
	ChunkRun
	SrcHead, DstHead, Heads, HeadBytes, RowBytes uint32
}

// sliceBytes is the bytes one page of the entry carries, given the destination page's
// token count.
func (r SliceRun) sliceBytes(pageTokens int64) int64 {
	return pageTokens * int64(r.Heads) * int64(r.HeadBytes)
}

// AppendSliceRuns appends the wire form of a sliced chunk's run list to dst.
func AppendSliceRuns(dst []byte, runs []SliceRun) []byte {
	for _, r := range runs {
		dst = appendSliceRun(dst, r)
	}
	return dst
}

// appendSliceRun appends one SliceRun's 32 bytes.
func appendSliceRun(dst []byte, r SliceRun) []byte {
	le := binary.LittleEndian
	dst = le.AppendUint32(dst, r.Buffer)
	dst = le.AppendUint32(dst, uint32(r.Start))
	dst = le.AppendUint32(dst, uint32(r.Count))
	dst = le.AppendUint32(dst, r.SrcHead)
	dst = le.AppendUint32(dst, r.DstHead)
	dst = le.AppendUint32(dst, r.Heads)
	dst = le.AppendUint32(dst, r.HeadBytes)
	return le.AppendUint32(dst, r.RowBytes)
}

// decodeSliceRun reads one SliceRun's 32 bytes; checkShape checks them.
func decodeSliceRun(e []byte) SliceRun {
	le := binary.LittleEndian
	return SliceRun{ChunkRun: decodeChunkRun(e), SrcHead: le.Uint32(e[12:]), DstHead: le.Uint32(e[16:]),
		Heads: le.Uint32(e[20:]), HeadBytes: le.Uint32(e[24:]), RowBytes: le.Uint32(e[28:])}
}

// DecodeSliceRuns parses n sliced run-list entries from b (exactly n*32 bytes) after
// checking them against crc. Each entry must have a non-negative start and a positive
// count (ErrEmptyRun), and a slice that lies inside its row: at least one head of at least
// one byte, every field within the layout bounds, (DstHead+Heads)*HeadBytes <= RowBytes
// (ErrBadSlice). Whether the slice is one its room expects, and whether RowBytes is the
// region's row, is the receiver's check. It appends to dst[:0] and never panics.
func DecodeSliceRuns(dst []SliceRun, b []byte, n uint32, crc uint32) ([]SliceRun, error) {
	if err := checkRunList(b, n, crc, sliceRunSize); err != nil {
		return dst[:0], err
	}
	out := dst[:0]
	for i := 0; i+sliceRunSize <= len(b); i += sliceRunSize {
		r := decodeSliceRun(b[i:])
		if r.Start < 0 || r.Count <= 0 {
			return out[:0], fmt.Errorf("%w: buffer %d run {start %d, count %d}", ErrEmptyRun, r.Buffer, r.Start, r.Count)
		}
		if err := r.checkShape(); err != nil {
			return out[:0], err
		}
		out = append(out, r)
	}
	return out, nil
}

// checkShape is the decoder's check of a slice on its own.
func (r SliceRun) checkShape() error {
	const most = maxHeadField
	if r.Heads < 1 || r.HeadBytes < 1 || r.RowBytes < 1 || r.Heads > most || r.HeadBytes > most ||
		r.SrcHead > most || r.DstHead > most || uint64(r.RowBytes) > uint64(most)*most ||
		(uint64(r.DstHead)+uint64(r.Heads))*uint64(r.HeadBytes) > uint64(r.RowBytes) {
		return fmt.Errorf("%w: buffer %d heads [%d,+%d) of %d bytes at head %d of a %d-byte row",
			ErrBadSlice, r.Buffer, r.SrcHead, r.Heads, r.HeadBytes, r.DstHead, r.RowBytes)
	}
	return nil
}
