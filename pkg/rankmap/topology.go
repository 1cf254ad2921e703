package rankmap

import "fmt"

// Attention says how one model's KV is spread over a side's TP ranks.
type Attention uint8

const (
	// MHA splits KV heads across ranks (MHA, GQA, MQA): rank r holds heads
	// [r*total/tp, (r+1)*total/tp), or, when total < tp, the one head r/(tp/total) that
	// tp/total consecutive ranks share (SGLang's kv_head_num = max(total/tp, 1)).
	MHA Attention = iota + 1
	// MLA keeps one latent per token that every rank holds whole (DeepSeek-style):
	// nothing is split, any rank can feed any other.
	MLA
)

func (a Attention) String() string {
	switch a {
	case MHA:
		return "mha"
	case MLA:
		return "mla"
	}
	return fmt.Sprintf("attention(%d)", uint8(a))
}

// MaxTP is the largest TP size Plan accepts: a decode room counts at most this many
// sending ranks (pkg/poll's MaxRanks).
const MaxTP = 64

// MaxBuffers bounds the KV buffers of one side (SGLang registers 2 per layer for MHA, 1 for
// MLA, plus draft-model buffers), so a plan stays small.
const MaxBuffers = 1024

// maxDim bounds each size factor, so that their product (a page's bytes) cannot overflow.
const maxDim = 1 << 20

// Buffer is one KV layer-buffer as a rank of one side holds it. A page is PageTokens token
// rows of RankHeads*HeadBytes bytes each (token-major, head-major within a token), so the
// buffer's item_len (SGLang kv_item_lens[i]) is ItemLen().
type Buffer struct {
	PageTokens int // tokens per page (SGLang page_size)
	TotalHeads int // KV heads of the model in this buffer (SGLang total_kv_head_num); MLA: heads of the latent, usually 1
	RankHeads  int // KV heads one rank holds (SGLang kv_head_num)
	HeadBytes  int // bytes of one head of one token: head_dim x dtype bytes
}

// RowBytes is the bytes of one token of one page on a rank.
func (b Buffer) RowBytes() int { return b.RankHeads * b.HeadBytes }

// ItemLen is the bytes of one page on a rank (pkg/transfer's BufferSpec.ItemLen).
func (b Buffer) ItemLen() int { return b.PageTokens * b.RowBytes() }

// Topology is one side's tensor-parallel shape: every rank of the side has the same buffers.
type Topology struct {
	TP          int // attention TP size (SGLang attn_tp_size)
	Attention   Attention
	Buffers     []Buffer
	AuxRowBytes int // bytes of one aux (metadata) row; 0 when the engine has none
}

// validate checks a side on its own; side names it in the error.
func (t Topology) validate(side string) error {
	if t.TP < 1 || t.TP > MaxTP {
		return fmt.Errorf("%w: %s tp %d, want 1..%d", ErrInvalidTP, side, t.TP, MaxTP)
	}
	if t.Attention != MHA && t.Attention != MLA {
		return fmt.Errorf("%w: %s %v", ErrUnknownAttention, side, t.Attention)
	}
	if len(t.Buffers) == 0 || len(t.Buffers) > MaxBuffers {
		return fmt.Errorf("%w: %s has %d buffers, want 1..%d", ErrBufferCountMismatch, side, len(t.Buffers), MaxBuffers)
	}
	if t.AuxRowBytes < 0 || t.AuxRowBytes > maxDim {
		return fmt.Errorf("%w: %s aux row %d bytes", ErrInvalidSize, side, t.AuxRowBytes)
	}
	for i, b := range t.Buffers {
		for _, f := range []struct {
			name string
			v    int
		}{{"page tokens", b.PageTokens}, {"total heads", b.TotalHeads}, {"heads per rank", b.RankHeads}, {"head bytes", b.HeadBytes}} {
			if f.v < 1 || f.v > maxDim {
				return fmt.Errorf("%w: %s buffer %d %s %d, want 1..%d", ErrInvalidSize, side, i, f.name, f.v, maxDim)
			}
		}
		if t.Attention == MLA {
			if b.RankHeads != b.TotalHeads {
				return fmt.Errorf("%w: %s buffer %d is mla with %d of %d heads per rank (mla replicates all)",
					ErrRankHeadsMismatch, side, i, b.RankHeads, b.TotalHeads)
			}
			continue
		}
		if (b.TotalHeads >= t.TP && b.TotalHeads%t.TP != 0) || (b.TotalHeads < t.TP && t.TP%b.TotalHeads != 0) {
			return fmt.Errorf("%w: %s buffer %d has %d kv heads over tp %d", ErrHeadsNotDivisible, side, i, b.TotalHeads, t.TP)
		}
		if want := max(b.TotalHeads/t.TP, 1); b.RankHeads != want {
			return fmt.Errorf("%w: %s buffer %d holds %d heads per rank, %d heads over tp %d give %d",
				ErrRankHeadsMismatch, side, i, b.RankHeads, b.TotalHeads, t.TP, want)
		}
	}
	return nil
}

// compatible checks the pair once each side is valid on its own.
func compatible(p, d Topology) error {
	if p.Attention != d.Attention {
		return fmt.Errorf("%w: prefill %v, decode %v", ErrMixedAttention, p.Attention, d.Attention)
	}
	if p.TP%d.TP != 0 && d.TP%p.TP != 0 {
		return fmt.Errorf("%w: prefill tp %d, decode tp %d", ErrTPNotDivisible, p.TP, d.TP)
	}
	if len(p.Buffers) != len(d.Buffers) {
		return fmt.Errorf("%w: prefill %d, decode %d", ErrBufferCountMismatch, len(p.Buffers), len(d.Buffers))
	}
	for i := range p.Buffers {
		pb, db := p.Buffers[i], d.Buffers[i]
		switch {
		case pb.PageTokens != db.PageTokens:
			return fmt.Errorf("%w: buffer %d prefill %d tokens, decode %d", ErrPageSizeMismatch, i, pb.PageTokens, db.PageTokens)
		case pb.HeadBytes != db.HeadBytes:
			return fmt.Errorf("%w: buffer %d prefill %d bytes, decode %d", ErrDtypeMismatch, i, pb.HeadBytes, db.HeadBytes)
		case pb.TotalHeads != db.TotalHeads:
			return fmt.Errorf("%w: buffer %d prefill %d, decode %d", ErrHeadCountMismatch, i, pb.TotalHeads, db.TotalHeads)
		}
	}
	if p.AuxRowBytes != d.AuxRowBytes {
		return fmt.Errorf("%w: prefill %d bytes, decode %d", ErrAuxRowMismatch, p.AuxRowBytes, d.AuxRowBytes)
	}
	return nil
}

// heldHeads is the global head range [h0, h1) that rank r of a TP-tp side holds of total
// heads under MHA, as SGLang's QKVParallelLinear lays them out (replicas are consecutive).
func heldHeads(total, tp, r int) (h0, h1 int) {
	if total >= tp {
		per := total / tp
		return r * per, (r + 1) * per
	}
	h := r / (tp / total)
	return h, h + 1
}
