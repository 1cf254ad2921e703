package transfer

import (
	"fmt"
	"slices"
	"sort"

	"github.com/pdlink/pdlink/pkg/rankmap"
)

// BufferSpec is one KV buffer inside a region file: Length bytes from Offset, split into
// pages of ItemLen bytes. Page p lives at Offset + p*ItemLen.
//
// The head fields describe a page's shape for rank mapping (pkg/rankmap): all zero is an
// opaque buffer, compared by ItemLen alone; set, ItemLen is PageTokens*RankHeads*HeadBytes.
type BufferSpec struct {
	Offset     int64 `json:"offset"`
	Length     int64 `json:"length"`
	ItemLen    int64 `json:"item_len"`
	PageTokens int64 `json:"page_tokens,omitempty"`
	TotalHeads int64 `json:"total_heads,omitempty"`
	RankHeads  int64 `json:"rank_heads,omitempty"`
	HeadBytes  int64 `json:"head_bytes,omitempty"`
}

// described reports whether any head field is set.
func (b BufferSpec) described() bool {
	return b.PageTokens != 0 || b.TotalHeads != 0 || b.RankHeads != 0 || b.HeadBytes != 0
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
// sides can check compatibility before any room is opened. Attention 0 with no buffer's
// head fields set is an opaque layout; Attention set with every buffer's head fields set is
// a described one (Described), which PlanRanks maps across TP sizes.
type Layout struct {
	Buffers   []BufferSpec      `json:"buffers"`
	Aux       AuxSpec           `json:"aux"`
	Rank      Rank              `json:"rank"`
	Attention rankmap.Attention `json:"attention,omitempty"`
}

// Described reports whether the layout gives its head shape (Attention set); Validate has
// checked that every buffer then gives its head fields.
func (l Layout) Described() bool { return l.Attention != 0 }

// Topology is the rank-mapping view of a described layout: the side's TP size, attention
// kind, each buffer's page shape and the aux row size.
func (l Layout) Topology() rankmap.Topology {
	t := rankmap.Topology{TP: int(l.Rank.Size), Attention: l.Attention, AuxRowBytes: int(l.Aux.RowLen),
		Buffers: make([]rankmap.Buffer, len(l.Buffers))}
	for i, b := range l.Buffers {
		t.Buffers[i] = rankmap.Buffer{PageTokens: int(b.PageTokens), TotalHeads: int(b.TotalHeads),
			RankHeads: int(b.RankHeads), HeadBytes: int(b.HeadBytes)}
	}
	return t
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
		if err := l.validateHeads(i, b); err != nil {
			return err
		}
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

// maxHeadField bounds each head field, as pkg/rankmap does, so that their product cannot
// overflow.
const maxHeadField = 1 << 20

// LayoutFieldError is an ErrInvalidLayout that names the layout field at fault, as the
// RegionLayout message spells it (buffers[2].rank_heads), so the edge can name it.
type LayoutFieldError struct {
	Field string
	Desc  string
}

func (e *LayoutFieldError) Error() string {
	return fmt.Sprintf("%v: %s %s", ErrInvalidLayout, e.Field, e.Desc)
}

// Unwrap makes the error an ErrInvalidLayout.
func (e *LayoutFieldError) Unwrap() error { return ErrInvalidLayout }

func fieldError(field, format string, args ...any) error {
	return &LayoutFieldError{Field: field, Desc: fmt.Sprintf(format, args...)}
}

// validateHeads checks buffer i's head fields against the layout's attention and TP size.
func (l Layout) validateHeads(i int, b BufferSpec) error {
	buf := fmt.Sprintf("buffers[%d]", i)
	switch {
	case l.Attention == 0 && !b.described():
		return nil // opaque
	case l.Attention == 0:
		return fieldError("attention", "unspecified, but %s sets head fields", buf)
	case l.Attention != rankmap.MHA && l.Attention != rankmap.MLA:
		return fieldError("attention", "%d unknown", l.Attention)
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"page_tokens", b.PageTokens}, {"total_heads", b.TotalHeads}, {"rank_heads", b.RankHeads}, {"head_bytes", b.HeadBytes}} {
		if f.v < 1 || f.v > maxHeadField {
			return fieldError(buf+"."+f.name, "%d, want 1..%d with attention %v", f.v, maxHeadField, l.Attention)
		}
	}
	tp := int64(l.Rank.Size)
	want := b.TotalHeads // mla: every rank holds the whole latent
	if l.Attention == rankmap.MHA {
		if (b.TotalHeads >= tp && b.TotalHeads%tp != 0) || (b.TotalHeads < tp && tp%b.TotalHeads != 0) {
			return fieldError(buf+".total_heads", "%d and tp_size %d do not divide", b.TotalHeads, tp)
		}
		want = max(b.TotalHeads/tp, 1)
	}
	if b.RankHeads != want {
		return fieldError(buf+".rank_heads", "%d, %v with %d heads over tp_size %d gives %d", b.RankHeads, l.Attention, b.TotalHeads, tp, want)
	}
	if got := b.PageTokens * b.RankHeads * b.HeadBytes; got != b.ItemLen {
		return fieldError(buf+".item_len", "%d, page_tokens %d x rank_heads %d x head_bytes %d is %d",
			b.ItemLen, b.PageTokens, b.RankHeads, b.HeadBytes, got)
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
// layout other: PlanRanks(l, other) succeeds. Buffer lengths (page counts) and offsets may
// differ. The error names the first mismatch.
func (l Layout) Compatible(other Layout) error {
	_, err := PlanRanks(l, other)
	return err
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

// WithHeads returns l described (for tests, demos and the simulator): every buffer's pages
// are pageTokens tokens of totalHeads heads of headBytes bytes over the layout's TP size,
// with the heads per rank that attention implies. Validate refuses it when a buffer's
// item_len is not the product.
func (l Layout) WithHeads(attention rankmap.Attention, pageTokens, totalHeads, headBytes int64) Layout {
	rankHeads := totalHeads
	if attention == rankmap.MHA {
		rankHeads = max(totalHeads/max(int64(l.Rank.Size), 1), 1)
	}
	l.Attention = attention
	l.Buffers = append([]BufferSpec(nil), l.Buffers...)
	for i := range l.Buffers {
		b := &l.Buffers[i]
		b.PageTokens, b.TotalHeads, b.RankHeads, b.HeadBytes = pageTokens, totalHeads, rankHeads, headBytes
	}
	return l
}

// Equal reports whether two layouts are the same, field for field.
func (l Layout) Equal(o Layout) bool {
	return l.Aux == o.Aux && l.Rank == o.Rank && l.Attention == o.Attention && slices.Equal(l.Buffers, o.Buffers)
}
