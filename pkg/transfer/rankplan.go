package transfer

import (
	"errors"
	"fmt"

	"github.com/pdlink/pdlink/pkg/rankmap"
)

// PlanRanks is the one place a prefill layout and a decode layout (any rank's of each side:
// a side's ranks share their shape) become the rank mapping every room between the two
// engines uses, or a refusal wrapping ErrIncompatibleLayout and the reason's sentinel:
//
//   - both described: rankmap.Plan of their Topologies (its sentinels: page size, dtype
//     bytes, head counts, TP sizes that do not divide, ...); MHA between different TP sizes
//     maps to head slices, which a stream carries as Stream.Copies and
//     Expectation.Copies (Mapping.CopiesFrom of its pair of ranks);
//   - either opaque: the layouts compare as opaque, buffer count (rankmap.ErrBufferCountMismatch),
//     item_len per buffer (rankmap.ErrPageSizeMismatch), aux row length
//     (rankmap.ErrAuxRowMismatch) and TP size (ErrOpaqueTP) must be equal, and the mapping
//     is the identity with whole pages.
//
// A layout that fails Validate is refused with ErrInvalidLayout, naming its side.
func PlanRanks(prefill, decode Layout) (rankmap.Mapping, error) {
	if err := prefill.Validate(); err != nil {
		return rankmap.Mapping{}, fmt.Errorf("prefill layout: %w", err)
	}
	if err := decode.Validate(); err != nil {
		return rankmap.Mapping{}, fmt.Errorf("decode layout: %w", err)
	}
	if prefill.Described() && decode.Described() {
		m, err := rankmap.Plan(prefill.Topology(), decode.Topology())
		if err != nil {
			return rankmap.Mapping{}, fmt.Errorf("%w: %w", ErrIncompatibleLayout, err)
		}
		return m, nil
	}
	if len(prefill.Buffers) != len(decode.Buffers) {
		return rankmap.Mapping{}, fmt.Errorf("%w: %w: prefill %d, decode %d", ErrIncompatibleLayout,
			rankmap.ErrBufferCountMismatch, len(prefill.Buffers), len(decode.Buffers))
	}
	for i := range prefill.Buffers {
		if a, b := prefill.Buffers[i].ItemLen, decode.Buffers[i].ItemLen; a != b {
			return rankmap.Mapping{}, fmt.Errorf("%w: %w: buffer %d item_len prefill %d, decode %d", ErrIncompatibleLayout,
				rankmap.ErrPageSizeMismatch, i, a, b)
		}
	}
	if a, b := prefill.Aux.RowLen, decode.Aux.RowLen; a != b {
		return rankmap.Mapping{}, fmt.Errorf("%w: %w: aux row_len prefill %d, decode %d", ErrIncompatibleLayout,
			rankmap.ErrAuxRowMismatch, a, b)
	}
	if a, b := prefill.Rank.Size, decode.Rank.Size; a != b {
		return rankmap.Mapping{}, fmt.Errorf("%w: %w: prefill tp %d, decode tp %d", ErrIncompatibleLayout, ErrOpaqueTP, a, b)
	}
	return opaqueIdentity(prefill, decode), nil
}

// opaqueIdentity is the equal-TP mapping of two opaque-compatible layouts: decode rank i is
// fed by prefill rank i alone, one whole-page copy per buffer (a page is one "head" of
// item_len bytes, so Mapping.Identity holds).
func opaqueIdentity(prefill, decode Layout) rankmap.Mapping {
	tp := int(prefill.Rank.Size)
	topo := func(l Layout) rankmap.Topology {
		t := rankmap.Topology{TP: tp, Attention: l.Attention, AuxRowBytes: int(l.Aux.RowLen), Buffers: make([]rankmap.Buffer, len(l.Buffers))}
		for i, b := range l.Buffers {
			t.Buffers[i] = rankmap.Buffer{PageTokens: 1, TotalHeads: 1, RankHeads: 1, HeadBytes: int(b.ItemLen)}
		}
		return t
	}
	m := rankmap.Mapping{Prefill: topo(prefill), Decode: topo(decode),
		DecodeRanks: make([]rankmap.DecodeRank, tp), PrefillRanks: make([]rankmap.PrefillRank, tp)}
	for r := range tp {
		copies := make([]rankmap.Copy, len(prefill.Buffers))
		for i, b := range prefill.Buffers {
			n := int(b.ItemLen)
			copies[i] = rankmap.Copy{Buffer: i, From: r, Heads: 1, HeadBytes: n, PageTokens: 1, SrcRow: n, DstRow: n}
		}
		m.DecodeRanks[r] = rankmap.DecodeRank{Rank: r, Targets: []int{r}, From: []int{r}, AuxFrom: r, Copies: copies}
		m.PrefillRanks[r] = rankmap.PrefillRank{Rank: r, To: []int{r}, AuxTo: []int{r}}
	}
	return m
}

// refusals are the closed set of reasons PlanRanks refuses a pair for, by the sentinel it
// wraps: the reason label of pdlink_peer_layout_refused_total.
var refusals = []struct {
	err    error
	reason string
}{
	{rankmap.ErrPageSizeMismatch, "page_size"},
	{rankmap.ErrDtypeMismatch, "dtype"},
	{rankmap.ErrHeadCountMismatch, "head_count"},
	{rankmap.ErrHeadsNotDivisible, "heads_not_divisible"},
	{rankmap.ErrRankHeadsMismatch, "rank_heads"},
	{rankmap.ErrBufferCountMismatch, "buffer_count"},
	{rankmap.ErrAuxRowMismatch, "aux_row"},
	{rankmap.ErrMixedAttention, "mixed_attention"},
	{rankmap.ErrUnknownAttention, "unknown_attention"},
	{rankmap.ErrTPNotDivisible, "tp_not_divisible"},
	{rankmap.ErrInvalidTP, "invalid_tp"},
	{rankmap.ErrInvalidSize, "invalid_size"},
	{rankmap.ErrUncovered, "uncovered"},
	{ErrOpaqueTP, "opaque_tp"},
	{ErrInvalidLayout, "invalid_layout"},
}

// RefusalReason is the closed-set name of the reason a PlanRanks error gives ("other" for
// an error PlanRanks does not return).
func RefusalReason(err error) string {
	for _, r := range refusals {
		if errors.Is(err, r.err) {
			return r.reason
		}
	}
	return "other"
}

// RefusalReasons is every value RefusalReason returns.
func RefusalReasons() []string {
	out := make([]string, 0, len(refusals)+1)
	for _, r := range refusals {
		out = append(out, r.reason)
	}
	return append(out, "other")
}
