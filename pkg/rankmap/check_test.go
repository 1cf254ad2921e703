package rankmap

import (
	"bytes"
	"math/rand/v2"
	"slices"
)

// tb is what the checks need from *testing.T and *rapid.T.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

// sglangHead is the global index of the j-th head prefill or decode rank r holds under MHA,
// written as SGLang's QKVParallelLinear states it: contiguous shards when total >= tp,
// else tp/total consecutive ranks replicate head r*total/tp.
func sglangHead(total, tp, r, j int) int {
	if total >= tp {
		return r*(total/tp) + j
	}
	return r * total / tp
}

// rankPage is rank r's copy of page p of buffer b of the global KV
// [pages][tokens][total heads][head bytes], as that rank holds it.
func rankPage(global []byte, t Topology, b, r, p int) []byte {
	buf := t.Buffers[b]
	out := make([]byte, 0, buf.ItemLen())
	for tok := range buf.PageTokens {
		for j := range buf.RankHeads {
			g := j
			if t.Attention == MHA {
				g = sglangHead(buf.TotalHeads, t.TP, r, j)
			}
			off := ((p*buf.PageTokens+tok)*buf.TotalHeads + g) * buf.HeadBytes
			out = append(out, global[off:off+buf.HeadBytes]...)
		}
	}
	return out
}

// checkStructure checks the rank lists against SGLang's rules and against each other.
func checkStructure(t tb, m Mapping) {
	t.Helper()
	tp, td := m.Prefill.TP, m.Decode.TP
	if len(m.DecodeRanks) != td || len(m.PrefillRanks) != tp {
		t.Fatalf("%d decode and %d prefill ranks for tp %d -> %d", len(m.DecodeRanks), len(m.PrefillRanks), tp, td)
	}
	addressed := make([]int, tp)
	for d, dr := range m.DecodeRanks {
		if dr.Rank != d {
			t.Fatalf("decode rank %d at index %d", dr.Rank, d)
		}
		switch {
		case tp >= td:
			span := tp / td
			if len(dr.Targets) != span || dr.Targets[0] != d*span || !contiguous(dr.Targets) {
				t.Fatalf("decode %d of tp %d -> %d targets %v, SGLang addresses %d ranks from %d", d, tp, td, dr.Targets, span, d*span)
			}
		default:
			if len(dr.Targets) != 1 || dr.Targets[0] != d*tp/td {
				t.Fatalf("decode %d of tp %d -> %d targets %v, SGLang addresses [%d]", d, tp, td, dr.Targets, d*tp/td)
			}
		}
		if len(dr.From) == 0 || !slices.IsSorted(dr.From) || !slices.IsSorted(dr.Dummies) {
			t.Fatalf("decode %d from %v dummies %v", d, dr.From, dr.Dummies)
		}
		for _, s := range dr.Targets {
			addressed[s]++
			if slices.Contains(dr.From, s) == slices.Contains(dr.Dummies, s) {
				t.Fatalf("decode %d target %d is in both or neither of from %v and dummies %v", d, s, dr.From, dr.Dummies)
			}
		}
		if len(dr.From)+len(dr.Dummies) != len(dr.Targets) || dr.AuxFrom != dr.From[0] || dr.ExpectedResponses() != len(dr.From) {
			t.Fatalf("decode %d targets %v from %v dummies %v aux %d", d, dr.Targets, dr.From, dr.Dummies, dr.AuxFrom)
		}
		for _, s := range dr.From {
			if !slices.ContainsFunc(dr.Copies, func(c Copy) bool { return c.From == s }) {
				t.Fatalf("decode %d waits for prefill %d that copies nothing", d, s)
			}
		}
		if m.Decode.Attention == MLA && (len(dr.From) != 1 || dr.From[0] != dr.Targets[0]) {
			t.Fatalf("mla decode %d from %v, SGLang reads only target %d", d, dr.From, dr.Targets[0])
		}
		if tp == td && (len(dr.From) != 1 || dr.From[0] != d) {
			t.Fatalf("equal tp decode %d from %v", d, dr.From)
		}
	}
	if tp == td && !m.Identity() {
		t.Fatalf("equal tp %d is not the identity:\n%v", tp, m)
	}
	for s, pr := range m.PrefillRanks {
		var to, dummies, aux []int
		for d, dr := range m.DecodeRanks {
			if slices.Contains(dr.From, s) {
				to = append(to, d)
			}
			if slices.Contains(dr.Dummies, s) {
				dummies = append(dummies, d)
			}
			if dr.AuxFrom == s {
				aux = append(aux, d)
			}
		}
		if pr.Rank != s || !slices.Equal(pr.To, to) || !slices.Equal(pr.Dummies, dummies) || !slices.Equal(pr.AuxTo, aux) {
			t.Fatalf("prefill %d to %v dummies %v aux %v, decode ranks say %v %v %v", s, pr.To, pr.Dummies, pr.AuxTo, to, dummies, aux)
		}
		if pr.Addressed() != addressed[s] {
			t.Fatalf("prefill %d addressed %d, decode ranks address it %d times", s, pr.Addressed(), addressed[s])
		}
		if td > tp && pr.Addressed() != td/tp {
			t.Fatalf("prefill %d addressed %d, SGLang's required_dst_info_num is %d", s, pr.Addressed(), td/tp)
		}
	}
}

func contiguous(xs []int) bool {
	for i := 1; i < len(xs); i++ {
		if xs[i] != xs[i-1]+1 {
			return false
		}
	}
	return true
}

// guardByte fills the gap after each destination page; a run that strays out of its page
// overwrites it.
const (
	guardByte = 0xa5
	guardLen  = 8
)

// checkBytes fills a random global KV of pages pages per buffer, splits it into prefill
// rank pages, applies the mapping's copies run by run into zeroed decode pages placed at a
// shuffled page list, and checks that every destination byte is written exactly once with
// the decode rank's own head slice, that no guard byte is touched, and that Copy.Apply
// lands the same bytes.
func checkBytes(t tb, m Mapping, pages int, rng *rand.Rand) {
	t.Helper()
	for b := range m.Decode.Buffers {
		pb, db := m.Prefill.Buffers[b], m.Decode.Buffers[b]
		global := make([]byte, pages*pb.PageTokens*pb.TotalHeads*pb.HeadBytes)
		for i := range global {
			global[i] = byte(rng.Uint32()) | 1 // never 0, so a missed byte shows
		}
		src := make([][][]byte, m.Prefill.TP)
		for s := range src {
			for p := range pages {
				src[s] = append(src[s], rankPage(global, m.Prefill, b, s, p))
			}
		}
		dstPageOf := rng.Perm(pages)
		stride := db.ItemLen() + guardLen
		for d, dr := range m.DecodeRanks {
			region := bytes.Repeat([]byte{guardByte}, pages*stride)
			for p := range pages {
				clear(region[p*stride : p*stride+db.ItemLen()])
			}
			writes := make([]int, len(region))
			viaApply := slices.Clone(region)
			for _, c := range dr.Copies {
				if c.Buffer != b {
					continue
				}
				if c.SrcItemLen() != pb.ItemLen() || c.DstItemLen() != db.ItemLen() {
					t.Fatalf("decode %d copy %v item lens %d->%d, buffers have %d->%d", d, c, c.SrcItemLen(), c.DstItemLen(), pb.ItemLen(), db.ItemLen())
				}
				checkContiguity(t, c)
				for p := range pages {
					base := dstPageOf[p] * stride
					for k := range c.Runs() {
						so, do, n := c.Run(k)
						if so < 0 || do < 0 || n <= 0 || so+n > pb.ItemLen() || do+n > db.ItemLen() {
							t.Fatalf("decode %d copy %v run %d [%d,+%d)->[%d,+%d) leaves its page", d, c, k, so, n, do, n)
						}
						copy(region[base+do:base+do+n], src[c.From][p][so:so+n])
						for i := base + do; i < base+do+n; i++ {
							writes[i]++
						}
					}
					c.Apply(viaApply[base:base+db.ItemLen()], src[c.From][p])
				}
			}
			for p := range pages {
				base := dstPageOf[p] * stride
				want := rankPage(global, m.Decode, b, d, p)
				for i := range stride {
					switch {
					case i >= db.ItemLen() && (region[base+i] != guardByte || writes[base+i] != 0):
						t.Fatalf("decode %d buffer %d page %d: guard byte %d written\n%v", d, b, p, i-db.ItemLen(), m)
					case i < db.ItemLen() && writes[base+i] != 1:
						t.Fatalf("decode %d buffer %d page %d byte %d written %d times\n%v", d, b, p, i, writes[base+i], m)
					case i < db.ItemLen() && region[base+i] != want[i]:
						t.Fatalf("decode %d buffer %d page %d byte %d = %#x, SGLang's rank holds %#x\n%v", d, b, p, i, region[base+i], want[i], m)
					}
				}
			}
			if !bytes.Equal(viaApply, region) {
				t.Fatalf("decode %d buffer %d: Copy.Apply differs from the runs\n%v", d, b, m)
			}
		}
	}
}

// checkContiguity checks SrcContiguous and DstContiguous against the runs: a contiguous side
// is covered by the runs back to back from offset 0, and Whole is both.
func checkContiguity(t tb, c Copy) {
	t.Helper()
	back2back := func(off func(k int) int, itemLen int) bool {
		at := 0
		for k := range c.Runs() {
			if off(k) != at {
				return false
			}
			_, _, n := c.Run(k)
			at += n
		}
		return at == itemLen
	}
	srcB2B := back2back(func(k int) int { s, _, _ := c.Run(k); return s }, c.SrcItemLen())
	dstB2B := back2back(func(k int) int { _, d, _ := c.Run(k); return d }, c.DstItemLen())
	if c.SrcContiguous() != srcB2B || c.DstContiguous() != dstB2B || c.Whole() != (srcB2B && dstB2B) {
		t.Fatalf("copy %v: src contiguous %v dst %v whole %v, runs say %v %v", c, c.SrcContiguous(), c.DstContiguous(), c.Whole(), srcB2B, dstB2B)
	}
}
