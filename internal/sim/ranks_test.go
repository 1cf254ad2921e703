package sim

import (
	"math/rand/v2"
	"testing"

	"github.com/pdlink/pdlink/pkg/transfer"
)

// TestRankLayoutsHoldWhatTheirAttentionGivesARank: TestLayout's 4 KV heads split over MHA
// ranks (2 each at TP 2, 1 each at TP 4, one replicated head at TP 8), MLA ranks hold the
// whole row, an opaque row is shared out evenly; every rank's layout names its rank.
func TestRankLayoutsHoldWhatTheirAttentionGivesARank(t *testing.T) {
	l := TestLayout() // 4 KiB per token over 4 buffers: 1 KiB rows of 4 heads of 256 B
	for _, c := range []struct {
		mla              bool
		tp               int
		rankHeads, items int64
	}{{false, 1, 4, 16 << 10}, {false, 2, 2, 8 << 10}, {false, 4, 1, 4 << 10}, {false, 8, 1, 4 << 10}, {true, 4, 4, 16 << 10}} {
		l.MLA = c.mla
		for rank := range c.tp {
			tl, err := l.RankTransfer(rank, c.tp)
			if err != nil {
				t.Fatalf("mla %v tp %d rank %d: %v", c.mla, c.tp, rank, err)
			}
			b := tl.Buffers[0]
			if int(tl.Rank.TP) != rank || int(tl.Rank.Size) != c.tp || b.TotalHeads != 4 || b.RankHeads != c.rankHeads || b.ItemLen != c.items {
				t.Errorf("mla %v tp %d rank %d: rank %+v, %d of %d heads, %d-byte pages; want %d heads, %d-byte pages",
					c.mla, c.tp, rank, tl.Rank, b.RankHeads, b.TotalHeads, b.ItemLen, c.rankHeads, c.items)
			}
		}
	}
	opaque := TestLayout()
	opaque.HeadDim = 0
	if tl, err := opaque.RankTransfer(1, 2); err != nil || tl.Described() || tl.Buffers[0].ItemLen != 8<<10 {
		t.Errorf("opaque tp 2: %+v %v, want half a 16 KiB page", tl.Buffers[0], err)
	}
	opaque.MLA = true
	if _, err := opaque.RankTransfer(0, 2); err == nil {
		t.Error("an mla layout without its head shape was accepted")
	}
}

// TestVerifyChecksEachDecodeRankAgainstTheSourcesItsMappingNames lands a room's pages
// on every decode rank the way the mapping says (whole pages at equal TP and MLA, head
// slices from several prefill ranks at MHA 4 -> 2 and 2 -> 4), and verify accepts it;
// it must then catch one decode rank holding another's bytes, one byte off in one
// rank's page, and one rank's aux row from the wrong prefill rank.
func TestVerifyChecksEachDecodeRankAgainstTheSourcesItsMappingNames(t *testing.T) {
	for _, c := range []struct {
		name              string
		mla               bool
		prefillTP, decode int
	}{{"equal 2", false, 2, 2}, {"equal 4", false, 4, 4}, {"mla 1 to 2", true, 1, 2}, {"mla 4 to 2", true, 4, 2},
		{"mha 4 to 2", false, 4, 2}, {"mha 2 to 4", false, 2, 4}} {
		t.Run(c.name, func(t *testing.T) {
			l := TestLayout()
			l.Pages, l.MLA = 16, c.mla
			r := offlineRun(t, l, c.prefillTP, c.decode)
			rq := request{tag: 0xF00D, pages: 4}
			h, ok := r.allocate(rq)
			if !ok {
				t.Fatal("allocate")
			}
			fillSources(r, rq, h)
			land(r, h)
			if bad := r.verify(h, 0); len(bad) != 0 {
				t.Fatalf("pages landed as the mapping says: decode ranks %v reported wrong", bad)
			}
			last := r.dec[c.decode-1]
			page := last.region.Pages(1, runOf(h.dst[last.rank][2]))
			page[len(page)/2] ^= 1
			if bad := r.verify(h, 0); len(bad) != 1 || bad[0] != last.rank {
				t.Errorf("one byte off on decode rank %d: verify reported ranks %v", last.rank, bad)
			}
			page[len(page)/2] ^= 1
			if c.decode > 1 && !c.mla || c.prefillTP == c.decode {
				// Decode ranks 0 and 1 hold different bytes: swap them.
				a, b := r.dec[0], r.dec[1]
				pa, pb := a.region.Pages(0, runOf(h.dst[0][0])), b.region.Pages(0, runOf(h.dst[1][0]))
				tmp := append([]byte(nil), pa...)
				copy(pa, pb)
				copy(pb, tmp)
				if bad := r.verify(h, 0); len(bad) != 2 {
					t.Errorf("decode ranks 0 and 1 swapped a page: verify reported ranks %v", bad)
				}
				copy(pb, pa)
				copy(pa, tmp)
			}
			if c.prefillTP > 1 {
				aux := r.dec[0].region.AuxRow(int64(h.dstAux[0]))
				other := r.plan.DecodeRanks[0].AuxFrom + 1
				copy(aux, r.pre[other%c.prefillTP].region.AuxRow(int64(h.srcAux[other%c.prefillTP])))
				if bad := r.verify(h, 0); len(bad) != 1 || bad[0] != 0 {
					t.Errorf("decode rank 0's aux row from prefill rank %d: verify reported ranks %v", other%c.prefillTP, bad)
				}
			}
			h.release(r.Sim)
		})
	}
}

// offlineRun is a run over engines in a temporary directory, with no daemon.
func offlineRun(t *testing.T, l Layout, prefillTP, decodeTP int) *run {
	t.Helper()
	dir := t.TempDir()
	s := &Sim{cfg: Config{Layout: l}, closing: make(chan struct{})}
	var err error
	if s.pre, err = newEngines(dir, l, prefillTP); err != nil {
		t.Fatal(err)
	}
	if s.dec, err = newEngines(dir, l, decodeTP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	if s.plan, err = transfer.PlanRanks(s.pre[0].tl, s.dec[0].tl); err != nil {
		t.Fatal(err)
	}
	return &run{Sim: s, cfg: s.cfg, stop: make(chan struct{})}
}

// fillSources fills every prefill rank's pages and aux row as serve does, and the decode
// pages with noise.
func fillSources(r *run, rq request, h *held) {
	for _, e := range r.pre {
		for b := range e.tl.Buffers {
			for pos, p := range h.src[e.rank] {
				fillPage(e.region.Pages(b, runOf(p)), rankTag(rq.tag, e.rank), b, pos)
			}
		}
		fillPage(e.region.AuxRow(int64(h.srcAux[e.rank])), rankTag(rq.tag, e.rank), auxBuffer, 0)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, e := range r.dec {
		for b := range e.tl.Buffers {
			for _, p := range h.dst[e.rank] {
				for i, page := 0, e.region.Pages(b, runOf(p)); i < len(page); i++ {
					page[i] = byte(rng.Uint32())
				}
			}
		}
	}
}

// land plays the daemons: every decode rank's pages get their copies from the prefill
// ranks the mapping names, and the aux row from AuxFrom.
func land(r *run, h *held) {
	for _, e := range r.dec {
		dr := r.plan.DecodeRanks[e.rank]
		for _, c := range dr.Copies {
			for pos, p := range h.dst[e.rank] {
				c.Apply(e.region.Pages(c.Buffer, runOf(p)), r.pre[c.From].region.Pages(c.Buffer, runOf(h.src[c.From][pos])))
			}
		}
		copy(e.region.AuxRow(int64(h.dstAux[e.rank])), r.pre[dr.AuxFrom].region.AuxRow(int64(h.srcAux[dr.AuxFrom])))
	}
}

// TestPageLandedTakesEachHeadSliceFromTheRankTheMappingNames checks one MHA 4 -> 2 decode
// page (two heads, each from its own prefill rank) and one MLA 4 -> 2 page (whole, from
// AuxFrom's rank) directly: the page built by the plan's copies passes; one head from a
// sibling rank, one byte off, the whole page from a dummy rank, and a plan missing one
// copy (its bytes then unchecked) all fail.
func TestPageLandedTakesEachHeadSliceFromTheRankTheMappingNames(t *testing.T) {
	for _, mla := range []bool{false, true} {
		l := TestLayout()
		l.MLA = mla
		pre, err := l.RankTransfer(0, 4)
		if err != nil {
			t.Fatal(err)
		}
		dec, err := l.RankTransfer(0, 2)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := transfer.PlanRanks(pre, dec)
		if err != nil {
			t.Fatal(err)
		}
		sources := make([][]byte, 4)
		for r := range sources {
			sources[r] = make([]byte, pre.Buffers[1].ItemLen)
			fillPage(sources[r], rankTag(7, r), 1, 3)
		}
		source := func(from int) []byte { return sources[from] }
		dr := plan.DecodeRanks[1]
		page := make([]byte, dec.Buffers[1].ItemLen)
		for _, c := range dr.Copies {
			if c.Buffer == 1 {
				c.Apply(page, source(c.From))
			}
		}
		if !PageLanded(dr, 1, page, source) {
			t.Fatalf("mla %v: the page the plan's copies built was reported wrong", mla)
		}
		page[len(page)-1] ^= 1
		if PageLanded(dr, 1, page, source) {
			t.Errorf("mla %v: one byte off passed", mla)
		}
		page[len(page)-1] ^= 1
		if mla {
			if PageLanded(dr, 1, sources[dr.Dummies[0]], source) {
				t.Errorf("the whole page from dummy rank %d passed", dr.Dummies[0])
			}
			continue
		}
		// Head 1 of the page (prefill rank 3's) taken from rank 2 instead.
		wrong := append([]byte(nil), page...)
		for _, c := range dr.Copies {
			if c.Buffer == 1 && c.From == 3 {
				c.Apply(wrong, source(2))
			}
		}
		if PageLanded(dr, 1, wrong, source) {
			t.Error("a head slice from the sibling prefill rank passed")
		}
		missing := dr
		missing.Copies = nil
		for _, c := range dr.Copies {
			if c.Buffer != 1 || c.From != 3 {
				missing.Copies = append(missing.Copies, c)
			}
		}
		if PageLanded(missing, 1, wrong, source) {
			t.Error("copies that leave a head unwritten passed a page whose head is wrong")
		}
	}
}
