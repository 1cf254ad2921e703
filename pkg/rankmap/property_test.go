package rankmap

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// genPair draws a prefill and decode topology that SGLang can map: TP sizes from
// {1,2,4,8}, a shared buffer shape per buffer, MHA head counts that are powers of two (so
// they divide or are divided by every TP) or an MLA latent of 1-2 heads.
func genPair(t *rapid.T) (Topology, Topology) {
	tps := []int{1, 2, 4, 8}
	tpP := rapid.SampledFrom(tps).Draw(t, "prefill_tp")
	tpD := rapid.SampledFrom(tps).Draw(t, "decode_tp")
	att := MHA
	if rapid.Bool().Draw(t, "mla") {
		att = MLA
	}
	aux := rapid.IntRange(0, 16).Draw(t, "aux_row")
	p := Topology{TP: tpP, Attention: att, AuxRowBytes: aux}
	d := Topology{TP: tpD, Attention: att, AuxRowBytes: aux}
	for range rapid.IntRange(1, 3).Draw(t, "buffers") {
		b := Buffer{
			PageTokens: rapid.IntRange(1, 4).Draw(t, "page_tokens"),
			HeadBytes:  rapid.IntRange(1, 6).Draw(t, "head_bytes"),
		}
		if att == MLA {
			b.TotalHeads = rapid.IntRange(1, 2).Draw(t, "mla_heads")
		} else {
			b.TotalHeads = rapid.SampledFrom([]int{1, 2, 4, 8, 16}).Draw(t, "kv_heads")
		}
		pb, db := b, b
		pb.RankHeads, db.RankHeads = rankHeads(b.TotalHeads, tpP, att), rankHeads(b.TotalHeads, tpD, att)
		p.Buffers = append(p.Buffers, pb)
		d.Buffers = append(d.Buffers, db)
	}
	return p, d
}

func rankHeads(total, tp int, att Attention) int {
	if att == MLA {
		return total
	}
	return max(total/tp, 1)
}

// TestPlanMovesEveryByteAsSGLangHoldsIt is the property test of issue 15: for random
// mappable topologies and random KV, applying the plan's copies fills every decode rank's
// pages with exactly its own head slice of the global KV, each byte written once, nothing
// outside the pages written, and the rank lists follow SGLang's rules.
func TestPlanMovesEveryByteAsSGLangHoldsIt(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p, d := genPair(t)
		m, err := Plan(p, d)
		if err != nil {
			t.Fatalf("plan %v -> %v: %v", p, d, err)
		}
		checkStructure(t, m)
		seed := rapid.Uint64().Draw(t, "seed")
		checkBytes(t, m, rapid.IntRange(1, 3).Draw(t, "pages"), rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)))
	})
}

// clone deep-copies a topology so a mutation cannot reach the other side's buffers.
func clone(t Topology) Topology {
	t.Buffers = slices.Clone(t.Buffers)
	return t
}

// breakers turn a mappable pair into one that cannot map, each with the one sentinel Plan
// must refuse it with.
var breakers = []struct {
	name  string
	want  error
	apply func(t *rapid.T, p, d *Topology)
}{
	{"tp zero or negative", ErrInvalidTP, func(t *rapid.T, p, d *Topology) {
		side(t, p, d).TP = rapid.IntRange(-3, 0).Draw(t, "tp")
	}},
	{"tp too large", ErrInvalidTP, func(t *rapid.T, p, d *Topology) { side(t, p, d).TP = MaxTP + 1 }},
	{"tp sizes do not divide", ErrTPNotDivisible, func(t *rapid.T, p, d *Topology) {
		p.TP, d.TP = 2, 3
		for i := range p.Buffers {
			h := 6
			if p.Attention == MLA {
				h = p.Buffers[i].TotalHeads
			}
			p.Buffers[i].TotalHeads, p.Buffers[i].RankHeads = h, rankHeads(h, 2, p.Attention)
			d.Buffers[i].TotalHeads, d.Buffers[i].RankHeads = h, rankHeads(h, 3, d.Attention)
		}
	}},
	{"size zero or negative", ErrInvalidSize, func(t *rapid.T, p, d *Topology) {
		s := side(t, p, d)
		b := &s.Buffers[rapid.IntRange(0, len(s.Buffers)-1).Draw(t, "buffer")]
		v := rapid.IntRange(-2, 0).Draw(t, "size")
		switch rapid.IntRange(0, 3).Draw(t, "field") {
		case 0:
			b.PageTokens = v
		case 1:
			b.TotalHeads = v
		case 2:
			b.RankHeads = v
		default:
			b.HeadBytes = v
		}
	}},
	{"size too large", ErrInvalidSize, func(t *rapid.T, p, d *Topology) { side(t, p, d).Buffers[0].HeadBytes = maxDim + 1 }},
	{"aux row negative", ErrInvalidSize, func(t *rapid.T, p, d *Topology) { side(t, p, d).AuxRowBytes = -1 }},
	{"attention unknown", ErrUnknownAttention, func(t *rapid.T, p, d *Topology) {
		side(t, p, d).Attention = Attention(rapid.SampledFrom([]uint8{0, 3, 255}).Draw(t, "attention"))
	}},
	{"mla on one side", ErrMixedAttention, func(t *rapid.T, p, d *Topology) {
		// the other side stays valid on its own: an MLA buffer holds all heads, an MHA
		// one its share
		if d.Attention == MLA {
			d.Attention = MHA
			for i := range d.Buffers {
				d.Buffers[i].TotalHeads, d.Buffers[i].RankHeads = d.TP, 1
			}
			return
		}
		d.Attention = MLA
		for i := range d.Buffers {
			d.Buffers[i].RankHeads = d.Buffers[i].TotalHeads
		}
	}},
	{"buffer count", ErrBufferCountMismatch, func(t *rapid.T, p, d *Topology) { d.Buffers = append(d.Buffers, d.Buffers[0]) }},
	{"no buffers", ErrBufferCountMismatch, func(t *rapid.T, p, d *Topology) { side(t, p, d).Buffers = nil }},
	{"too many buffers", ErrBufferCountMismatch, func(t *rapid.T, p, d *Topology) {
		s := side(t, p, d)
		for len(s.Buffers) <= MaxBuffers {
			s.Buffers = append(s.Buffers, s.Buffers[0])
		}
	}},
	{"page size", ErrPageSizeMismatch, func(t *rapid.T, p, d *Topology) { d.Buffers[len(d.Buffers)-1].PageTokens++ }},
	{"bytes per head", ErrDtypeMismatch, func(t *rapid.T, p, d *Topology) { d.Buffers[len(d.Buffers)-1].HeadBytes *= 2 }},
	{"total heads", ErrHeadCountMismatch, func(t *rapid.T, p, d *Topology) {
		b := &d.Buffers[len(d.Buffers)-1]
		b.TotalHeads *= 2
		b.RankHeads = rankHeads(b.TotalHeads, d.TP, d.Attention)
	}},
	{"heads do not divide tp", ErrHeadsNotDivisible, func(t *rapid.T, p, d *Topology) {
		s := side(t, p, d)
		s.Attention, s.TP = MHA, rapid.SampledFrom([]int{2, 4, 8}).Draw(t, "tp")
		s.Buffers[0].TotalHeads, s.Buffers[0].RankHeads = 3, 1
	}},
	{"heads per rank", ErrRankHeadsMismatch, func(t *rapid.T, p, d *Topology) {
		s := side(t, p, d)
		s.Buffers[rapid.IntRange(0, len(s.Buffers)-1).Draw(t, "buffer")].RankHeads++
	}},
	{"aux row length", ErrAuxRowMismatch, func(t *rapid.T, p, d *Topology) { d.AuxRowBytes++ }},
}

// side picks the prefill or the decode topology to break.
func side(t *rapid.T, p, d *Topology) *Topology {
	if rapid.Bool().Draw(t, "break_prefill") {
		return p
	}
	return d
}

// TestPlanRefusesUnmappableTopologies breaks one thing in a mappable pair and checks Plan
// refuses it with that thing's sentinel, and with nothing else, without panicking.
func TestPlanRefusesUnmappableTopologies(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p, d := genPair(t)
		p, d = clone(p), clone(d)
		br := rapid.SampledFrom(breakers).Draw(t, "breaker")
		br.apply(t, &p, &d)
		m, err := Plan(p, d)
		if !errors.Is(err, br.want) {
			t.Fatalf("%s: plan %v -> %v: err %v, want %v", br.name, p, d, err, br.want)
		}
		for _, other := range sentinels {
			if other != br.want && errors.Is(err, other) {
				t.Fatalf("%s: err %v also matches %v", br.name, err, other)
			}
		}
		if m.DecodeRanks != nil || m.PrefillRanks != nil {
			t.Fatalf("%s: refused plan carries ranks: %v", br.name, m)
		}
	})
}

// sentinels is every error Plan may wrap.
var sentinels = []error{
	ErrInvalidTP, ErrTPNotDivisible, ErrInvalidSize, ErrUnknownAttention, ErrMixedAttention,
	ErrBufferCountMismatch, ErrPageSizeMismatch, ErrDtypeMismatch, ErrHeadCountMismatch,
	ErrHeadsNotDivisible, ErrRankHeadsMismatch, ErrAuxRowMismatch, ErrUncovered,
}

// FuzzPlan feeds raw topology numbers: Plan refuses with one of its sentinels or plans, and
// a plan small enough to fill passes the same byte checks as the property test.
func FuzzPlan(f *testing.F) {
	for _, tc := range goldenCases {
		pb, db := tc.prefill.Buffers[0], tc.decode.Buffers[0]
		f.Add(tc.prefill.TP, tc.decode.TP, tc.prefill.Attention == MLA, tc.decode.Attention == MLA, uint8(2), uint8(2),
			pb.PageTokens, db.PageTokens, pb.TotalHeads, db.TotalHeads, pb.RankHeads, db.RankHeads, pb.HeadBytes, db.HeadBytes, 64, 64)
	}
	f.Add(2, 3, false, false, uint8(1), uint8(1), 1, 1, 6, 6, 3, 2, 2, 2, 0, 0)
	f.Add(0, -1, true, false, uint8(0), uint8(9), -1, 0, 0, -5, 1, 1, 1, 1, -1, 0)
	f.Fuzz(func(t *testing.T, tpP, tpD int, mlaP, mlaD bool, nbP, nbD uint8, pageP, pageD, totP, totD, rankP, rankD, hbP, hbD, auxP, auxD int) {
		mk := func(tp int, mla bool, n uint8, page, tot, rank, hb, aux int) Topology {
			top := Topology{TP: tp, Attention: MHA, AuxRowBytes: aux}
			if mla {
				top.Attention = MLA
			}
			for range n % 6 {
				top.Buffers = append(top.Buffers, Buffer{PageTokens: page, TotalHeads: tot, RankHeads: rank, HeadBytes: hb})
			}
			return top
		}
		m, err := Plan(mk(tpP, mlaP, nbP, pageP, totP, rankP, hbP, auxP), mk(tpD, mlaD, nbD, pageD, totD, rankD, hbD, auxD))
		if err != nil {
			if !slices.ContainsFunc(sentinels, func(s error) bool { return errors.Is(err, s) }) {
				t.Fatalf("error %v wraps no sentinel", err)
			}
			return
		}
		checkStructure(t, m)
		if bytes := len(m.Prefill.Buffers) * (m.Prefill.TP*m.Prefill.Buffers[0].ItemLen() + m.Decode.TP*m.Decode.Buffers[0].ItemLen()); bytes <= 1<<20 {
			checkBytes(t, m, 2, rand.New(rand.NewPCG(uint64(tpP), uint64(totP))))
		}
	})
}
