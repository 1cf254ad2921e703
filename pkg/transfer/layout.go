package transfer

import (
	"fmt"
	"sort"
)

// BufferSpec is one KV buffer inside a region file: Length bytes from Offset, split into
// pages of ItemLen bytes. Page p lives at Offset + p*ItemLen.
type BufferSpec struct {
	Offset  int64 `json:"offset"`
	Length  int64 `json:"length"`
	ItemLen int64 `json:"item_len"`
}

// Pages is the number of whole pages in the buffer.
func (b BufferSpec) Pages() int64 {
	if b.ItemLen <= 0 {
		return 0
	}
	return b.Length / b.ItemLen
}

// AuxSpec is the aux buffer: Rows fixed-size rows of RowLen bytes from Offset (first token,
// logprobs, the room id echo; the content is the engine's business).
type AuxSpec struct {
	Offset int64 `json:"offset"`
	RowLen int64 `json:"row_len"`
	Rows   int64 `json:"rows"`
}

// Layout describes how an engine's KV memory file is split. It travels in REGISTER so both
// sides can check compatibility before any room is opened.
type Layout struct {
	Buffers []BufferSpec `json:"buffers"`
	Aux     AuxSpec      `json:"aux"`
	Rank    Rank         `json:"rank"`
}

// maxPagesPerBuffer keeps page indices within the int32 of a Run.
const maxPagesPerBuffer = 1<<31 - 1

// Validate checks the layout on its own: positive page sizes, lengths that are whole pages,
// no overlapping buffers, and a sane tensor-parallel rank.
func (l Layout) Validate() error {
	if len(l.Buffers) == 0 {
		return fmt.Errorf("%w: no buffers", ErrInvalidLayout)
	}
	if l.Rank.Size < 1 || l.Rank.TP >= l.Rank.Size {
		return fmt.Errorf("%w: tp rank %d of size %d", ErrInvalidLayout, l.Rank.TP, l.Rank.Size)
	}
	type span struct {
		buffer   int // -1 for the aux rows
		off, end int64
	}
	name := func(s span) string { // only for an error: Validate runs at every bind
		if s.buffer < 0 {
			return "aux"
		}
		return fmt.Sprintf("buffer %d", s.buffer)
	}
	spans := make([]span, 0, len(l.Buffers)+1)
	for i, b := range l.Buffers {
		switch {
		case b.ItemLen <= 0:
			return fmt.Errorf("%w: buffer %d item_len %d", ErrInvalidLayout, i, b.ItemLen)
		case b.Offset < 0 || b.Length <= 0:
			return fmt.Errorf("%w: buffer %d offset %d length %d", ErrInvalidLayout, i, b.Offset, b.Length)
		case b.Length%b.ItemLen != 0:
			return fmt.Errorf("%w: buffer %d length %d is not a multiple of item_len %d",
				ErrInvalidLayout, i, b.Length, b.ItemLen)
		case b.Pages() > maxPagesPerBuffer:
			return fmt.Errorf("%w: buffer %d has %d pages", ErrInvalidLayout, i, b.Pages())
		case b.Offset > 1<<62-b.Length:
			return fmt.Errorf("%w: buffer %d ends past 2^62", ErrInvalidLayout, i)
		}
		spans = append(spans, span{i, b.Offset, b.Offset + b.Length})
	}
	a := l.Aux
	if a.Rows < 0 || a.RowLen < 0 || a.Offset < 0 || (a.Rows > 0) != (a.RowLen > 0) {
		return fmt.Errorf("%w: aux offset %d row_len %d rows %d", ErrInvalidLayout, a.Offset, a.RowLen, a.Rows)
	}
	if a.Rows > 0 {
		if a.Rows > maxPagesPerBuffer || a.RowLen > maxFrameMeta || a.Offset > 1<<62-a.Rows*a.RowLen {
			return fmt.Errorf("%w: aux too large", ErrInvalidLayout)
		}
		spans = append(spans, span{-1, a.Offset, a.Offset + a.Rows*a.RowLen})
	}
	sort.Slice(spans, func(i, j int) bool { return spans[i].off < spans[j].off })
	for i := 1; i < len(spans); i++ {
		if spans[i].off < spans[i-1].end {
			return fmt.Errorf("%w: %s overlaps %s", ErrInvalidLayout, name(spans[i]), name(spans[i-1]))
		}
	}
	return nil
}

// Size is the number of bytes the region file must have.
func (l Layout) Size() int64 {
	var end int64
	for _, b := range l.Buffers {
		end = max(end, b.Offset+b.Length)
	}
	if l.Aux.Rows > 0 {
		end = max(end, l.Aux.Offset+l.Aux.Rows*l.Aux.RowLen)
	}
	return end
}

// Compatible reports whether pages can move between a region with layout l and one with
// layout other: same buffer count, same item_len per buffer, same aux row length and the same
// tensor-parallel size. Buffer lengths (page counts) and offsets may differ. The error names
// the first mismatch. Both sides call it at REGISTER time.
func (l Layout) Compatible(other Layout) error {
	if err := l.Validate(); err != nil {
		return fmt.Errorf("local layout: %w", err)
	}
	if err := other.Validate(); err != nil {
		return fmt.Errorf("peer layout: %w", err)
	}
	if len(l.Buffers) != len(other.Buffers) {
		return fmt.Errorf("%w: buffer count %d, peer has %d", ErrIncompatibleLayout, len(l.Buffers), len(other.Buffers))
	}
	for i := range l.Buffers {
		if a, b := l.Buffers[i].ItemLen, other.Buffers[i].ItemLen; a != b {
			return fmt.Errorf("%w: buffer %d item_len (page size) %d, peer has %d", ErrIncompatibleLayout, i, a, b)
		}
	}
	if l.Aux.RowLen != other.Aux.RowLen {
		return fmt.Errorf("%w: aux row_len %d, peer has %d", ErrIncompatibleLayout, l.Aux.RowLen, other.Aux.RowLen)
	}
	if l.Rank.Size != other.Rank.Size {
		return fmt.Errorf("%w: tp size %d, peer has %d (tp fan-out is not supported yet)",
			ErrIncompatibleLayout, l.Rank.Size, other.Rank.Size)
	}
	return nil
}

// UniformLayout is a helper for tests and demos: n buffers of pages pages of itemLen bytes
// laid out back to back, followed by rows aux rows of rowLen bytes. TP rank 0 of 1.
func UniformLayout(n int, pages, itemLen int64, rows, rowLen int64) Layout {
	l := Layout{Rank: Rank{Size: 1}}
	var off int64
	for range n {
		l.Buffers = append(l.Buffers, BufferSpec{Offset: off, Length: pages * itemLen, ItemLen: itemLen})
		off += pages * itemLen
	}
	if rows > 0 {
		l.Aux = AuxSpec{Offset: off, RowLen: rowLen, Rows: rows}
	}
	return l
}
