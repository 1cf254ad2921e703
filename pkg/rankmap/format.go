package rankmap

import (
	"fmt"
	"slices"
	"strings"
)

// String is a compact one-line form of a side, for logs and golden plans.
func (t Topology) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "tp=%d %v aux=%dB buffers=", t.TP, t.Attention, t.AuxRowBytes)
	if len(t.Buffers) > 0 && !slices.ContainsFunc(t.Buffers, func(x Buffer) bool { return x != t.Buffers[0] }) {
		fmt.Fprintf(&b, "%dx%v", len(t.Buffers), t.Buffers[0])
		return b.String()
	}
	for i, x := range t.Buffers {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(x.String())
	}
	return b.String()
}

// String is a buffer as "[page=P heads=rank/total head=NB item=NB]".
func (b Buffer) String() string {
	return fmt.Sprintf("[page=%d heads=%d/%d head=%dB item=%dB]", b.PageTokens, b.RankHeads, b.TotalHeads, b.HeadBytes, b.ItemLen())
}

// String is a copy as "b<buffer> p<from> heads [h0,h1) -> [d0,d1)" and its runs per page.
func (c Copy) String() string {
	s := fmt.Sprintf("b%d p%d heads [%d,%d) -> [%d,%d)", c.Buffer, c.From, c.SrcHead, c.SrcHead+c.Heads, c.DstHead, c.DstHead+c.Heads)
	if c.Whole() {
		return s + fmt.Sprintf(" whole %dB", c.SrcItemLen())
	}
	return s + fmt.Sprintf(" %dx%dB rows %dB->%dB", c.PageTokens, c.Heads*c.HeadBytes, c.SrcRow, c.DstRow)
}

// String is the whole plan, one line per decode rank, copy and prefill rank; golden tests
// compare it.
func (m Mapping) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "prefill %v\ndecode  %v\nidentity %v\n", m.Prefill, m.Decode, m.Identity())
	for _, d := range m.DecodeRanks {
		fmt.Fprintf(&b, "decode %d: targets %v from %v dummies %v aux %d responses %d\n",
			d.Rank, d.Targets, d.From, d.Dummies, d.AuxFrom, d.ExpectedResponses())
		for _, c := range d.Copies {
			fmt.Fprintf(&b, "  %v\n", c)
		}
	}
	for _, p := range m.PrefillRanks {
		fmt.Fprintf(&b, "prefill %d: to %v dummies %v aux %v addressed %d\n", p.Rank, p.To, p.Dummies, p.AuxTo, p.Addressed())
	}
	return b.String()
}
