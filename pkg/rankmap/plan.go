package rankmap

import (
	"fmt"
	"slices"
)

// Copy is one source rank's contribution to one buffer's page on one decode rank: heads
// [SrcHead, SrcHead+Heads) of prefill rank From land at heads [DstHead, DstHead+Heads) of
// the destination, in every token of the page. The same Copy serves every page of a room:
// the caller adds its page bases (offset + page*item_len on each side).
type Copy struct {
	Buffer     int // index into the Topology's Buffers
	From       int // prefill rank
	SrcHead    int // first head within the source rank's row
	DstHead    int // first head within the destination rank's row
	Heads      int
	HeadBytes  int
	PageTokens int
	SrcRow     int // bytes of one token on the source rank
	DstRow     int // bytes of one token on the destination rank
}

// Whole reports whether the copy is the whole page on both sides (equal TP, MLA, or equal
// replicated heads): one SrcItemLen() byte copy, and consecutive pages can merge into one run.
func (c Copy) Whole() bool {
	return c.SrcHead == 0 && c.DstHead == 0 && c.Heads*c.HeadBytes == c.SrcRow && c.SrcRow == c.DstRow
}

// SrcContiguous reports whether the copy reads the source page whole (the source rank's heads
// all go to this destination: prefill TP >= decode TP), so a sender can ship the page as is
// and let the receiver scatter it.
func (c Copy) SrcContiguous() bool { return c.SrcHead == 0 && c.Heads*c.HeadBytes == c.SrcRow }

// DstContiguous reports whether the copy fills the destination page whole (decode TP >=
// prefill TP), so a sender can gather the runs and the receiver write one page.
func (c Copy) DstContiguous() bool { return c.DstHead == 0 && c.Heads*c.HeadBytes == c.DstRow }

// SrcItemLen is the bytes of one page on the source rank.
func (c Copy) SrcItemLen() int { return c.PageTokens * c.SrcRow }

// DstItemLen is the bytes of one page on the destination rank.
func (c Copy) DstItemLen() int { return c.PageTokens * c.DstRow }

// Runs is the number of contiguous byte runs the copy takes within one page: 1 when Whole,
// else one per token.
func (c Copy) Runs() int {
	if c.Whole() {
		return 1
	}
	return c.PageTokens
}

// Run is the i-th run (0 <= i < Runs()): n bytes from offset src of the source page to
// offset dst of the destination page.
func (c Copy) Run(i int) (src, dst, n int) {
	if c.Whole() {
		return 0, 0, c.SrcItemLen()
	}
	return i*c.SrcRow + c.SrcHead*c.HeadBytes, i*c.DstRow + c.DstHead*c.HeadBytes, c.Heads * c.HeadBytes
}

// Apply copies the slice from one source page to one destination page; srcPage and dstPage
// are exactly one page each (SrcItemLen and DstItemLen bytes).
func (c Copy) Apply(dstPage, srcPage []byte) {
	if c.Whole() {
		copy(dstPage[:c.DstItemLen()], srcPage[:c.SrcItemLen()])
		return
	}
	n := c.Heads * c.HeadBytes
	s, d := c.SrcHead*c.HeadBytes, c.DstHead*c.HeadBytes
	for range c.PageTokens {
		copy(dstPage[d:d+n], srcPage[s:s+n])
		s += c.SrcRow
		d += c.DstRow
	}
}

// DecodeRank is what one decode rank needs: whom it addresses, whom it waits for, and the
// copies that fill its pages.
type DecodeRank struct {
	Rank int
	// Targets are the prefill ranks this decode rank sends the room's METADATA to (SGLang's
	// target_tp_ranks), ascending.
	Targets []int
	// From is the completion set: the prefill ranks whose KV (and, for AuxFrom, aux) must be
	// in place before the room is Success here, ascending. len(From) is the response count.
	From []int
	// Dummies are the Targets outside From: addressed, they send nothing for this rank
	// (SGLang's is_dummy) and must not be waited for.
	Dummies []int
	// AuxFrom is the one prefill rank that writes this rank's aux row; it is From[0].
	AuxFrom int
	// Copies fill every byte of every buffer's page exactly once, ordered by buffer, then
	// destination head.
	Copies []Copy
}

// WholePages reports whether the rank reads whole pages of every buffer from one prefill rank
// (equal TP, MLA, or a rank whose row is one replicated head the source holds alone): one
// stream of whole pages then feeds it, keyed by the decode rank alone, and nothing is
// sliced. Both daemons must take this one answer, or one sends whole pages to a stream the
// other expects as head slices of another key.
func (d DecodeRank) WholePages() bool {
	if len(d.From) != 1 {
		return false
	}
	for _, c := range d.Copies {
		if !c.Whole() {
			return false
		}
	}
	return true
}

// ExpectedResponses is how many prefill ranks must report before the room is Success on
// this decode rank.
func (d DecodeRank) ExpectedResponses() int { return len(d.From) }

// PrefillRank is one prefill rank's side of the mapping.
type PrefillRank struct {
	Rank int
	// To is the fan-out: the decode ranks this rank writes KV to, ascending.
	To []int
	// Dummies are the decode ranks that address this rank but get nothing from it; it still
	// answers their METADATA and does not wait on them.
	Dummies []int
	// AuxTo are the decode ranks whose aux row this rank writes (a subset of To).
	AuxTo []int
}

// Addressed is how many decode ranks send this rank METADATA for one room (SGLang's
// required_dst_info_num): the room here waits for that many before it may send.
func (p PrefillRank) Addressed() int { return len(p.To) + len(p.Dummies) }

// Mapping is the plan for one (prefill topology, decode topology) pair.
type Mapping struct {
	Prefill, Decode Topology
	DecodeRanks     []DecodeRank  // indexed by decode rank
	PrefillRanks    []PrefillRank // indexed by prefill rank
}

// Identity reports whether the mapping is equal TP with whole pages: prefill rank i feeds
// decode rank i alone, every copy Whole (the caller's fast path, unchanged from TP 1).
func (m Mapping) Identity() bool {
	if m.Prefill.TP != m.Decode.TP {
		return false
	}
	for _, d := range m.DecodeRanks {
		if len(d.From) != 1 || d.From[0] != d.Rank {
			return false
		}
		for _, c := range d.Copies {
			if !c.Whole() {
				return false
			}
		}
	}
	return true
}

// CopiesFrom returns the copies prefill rank from makes into decode rank to (nil for a dummy
// or unrelated pair).
func (m Mapping) CopiesFrom(from, to int) []Copy {
	if to < 0 || to >= len(m.DecodeRanks) {
		return nil
	}
	var out []Copy
	for _, c := range m.DecodeRanks[to].Copies {
		if c.From == from {
			out = append(out, c)
		}
	}
	return out
}

// Plan maps prefill TP ranks onto decode TP ranks as SGLang resolves them, or refuses with
// a sentinel from errors.go when the layouts cannot map.
//
// Which prefill ranks a decode rank d addresses (Targets) follows SGLang's decode-side rule:
// equal TP, prefill d; decode TP larger, prefill d/(decode/prefill); prefill TP larger, the
// prefill/decode ranks from d*(prefill/decode). MLA reads the whole latent from the first
// target and the others are dummies. MHA takes every head decode rank d holds from the
// first target that holds it, so a head replicated on several prefill ranks (total heads <
// prefill TP) is written once, from the lowest replica, and the other replicas are dummies
// for d. SGLang writes each replica's identical bytes instead; the bytes that land are the
// same.
func Plan(prefill, decode Topology) (Mapping, error) {
	if err := prefill.validate("prefill"); err != nil {
		return Mapping{}, err
	}
	if err := decode.validate("decode"); err != nil {
		return Mapping{}, err
	}
	if err := compatible(prefill, decode); err != nil {
		return Mapping{}, err
	}
	m := Mapping{
		Prefill:      prefill,
		Decode:       decode,
		DecodeRanks:  make([]DecodeRank, decode.TP),
		PrefillRanks: make([]PrefillRank, prefill.TP),
	}
	for s := range m.PrefillRanks {
		m.PrefillRanks[s].Rank = s
	}
	for d := range m.DecodeRanks {
		dr, err := planDecodeRank(prefill, decode, d)
		if err != nil {
			return Mapping{}, err
		}
		m.DecodeRanks[d] = dr
		for _, s := range dr.Targets {
			pr := &m.PrefillRanks[s]
			if slices.Contains(dr.From, s) {
				pr.To = append(pr.To, d)
			} else {
				pr.Dummies = append(pr.Dummies, d)
			}
		}
		m.PrefillRanks[dr.AuxFrom].AuxTo = append(m.PrefillRanks[dr.AuxFrom].AuxTo, d)
	}
	return m, nil
}

// targets is SGLang's target_tp_ranks for decode rank d.
func targets(prefillTP, decodeTP, d int) []int {
	switch {
	case prefillTP == decodeTP:
		return []int{d}
	case decodeTP > prefillTP:
		return []int{d / (decodeTP / prefillTP)}
	}
	span := prefillTP / decodeTP
	out := make([]int, span)
	for i := range out {
		out[i] = d*span + i
	}
	return out
}

// planDecodeRank is decode rank d's targets, copies and completion set.
func planDecodeRank(prefill, decode Topology, d int) (DecodeRank, error) {
	dr := DecodeRank{Rank: d, Targets: targets(prefill.TP, decode.TP, d)}
	for i := range decode.Buffers {
		pb, db := prefill.Buffers[i], decode.Buffers[i]
		base := Copy{Buffer: i, HeadBytes: db.HeadBytes, PageTokens: db.PageTokens, SrcRow: pb.RowBytes(), DstRow: db.RowBytes()}
		if decode.Attention == MLA {
			c := base
			c.From, c.Heads = dr.Targets[0], db.RankHeads
			dr.Copies = append(dr.Copies, c)
			continue
		}
		g0, g1 := heldHeads(db.TotalHeads, decode.TP, d)
		for g := g0; g < g1; {
			src, s0, s1 := -1, 0, 0
			for _, s := range dr.Targets {
				if h0, h1 := heldHeads(pb.TotalHeads, prefill.TP, s); g >= h0 && g < h1 {
					src, s0, s1 = s, h0, h1
					break
				}
			}
			if src < 0 {
				return DecodeRank{}, fmt.Errorf("%w: decode rank %d buffer %d head %d, targets %v", ErrUncovered, d, i, g, dr.Targets)
			}
			end := min(g1, s1)
			c := base
			c.From, c.SrcHead, c.DstHead, c.Heads = src, g-s0, g-g0, end-g
			dr.Copies = append(dr.Copies, c)
			g = end
		}
	}
	for _, c := range dr.Copies {
		if !slices.Contains(dr.From, c.From) {
			dr.From = append(dr.From, c.From)
		}
	}
	slices.Sort(dr.From)
	for _, s := range dr.Targets {
		if !slices.Contains(dr.From, s) {
			dr.Dummies = append(dr.Dummies, s)
		}
	}
	dr.AuxFrom = dr.From[0]
	return dr, nil
}
