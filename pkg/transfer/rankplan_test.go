package transfer

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/pdlink/pdlink/pkg/rankmap"
)

// described is 2 buffers of 16-token pages of 8 heads of 128 bytes, TP 1.
func described() Layout {
	return UniformLayout(2, 16, 16*8*128, 4, 64).WithHeads(rankmap.MHA, 16, 8, 128)
}

func TestValidateNamesTheInconsistentHeadField(t *testing.T) {
	if err := described().Validate(); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		edit  func(*Layout)
		field string
	}{
		{"heads without attention", func(l *Layout) { l.Attention = 0 }, "attention"},
		{"unknown attention", func(l *Layout) { l.Attention = 9 }, "attention"},
		{"attention on an opaque buffer", func(l *Layout) {
			l.Buffers[1].PageTokens, l.Buffers[1].TotalHeads, l.Buffers[1].RankHeads, l.Buffers[1].HeadBytes = 0, 0, 0, 0
		}, "buffers[1].page_tokens"},
		{"zero head bytes", func(l *Layout) { l.Buffers[0].HeadBytes = 0 }, "buffers[0].head_bytes"},
		{"item_len not the product", func(l *Layout) { l.Buffers[1].PageTokens = 8 }, "buffers[1].item_len"},
		{"rank heads not total over tp", func(l *Layout) { l.Buffers[0].RankHeads = 4; l.Buffers[0].HeadBytes = 256 }, "buffers[0].rank_heads"},
		{"heads that do not divide tp", func(l *Layout) {
			l.Rank = Rank{Size: 3}
		}, "buffers[0].total_heads"},
		{"mla holding part of the latent", func(l *Layout) { l.Attention = rankmap.MLA; l.Buffers[0].TotalHeads = 16 }, "buffers[0].rank_heads"},
	}
	for _, c := range cases {
		l := described()
		c.edit(&l)
		err := l.Validate()
		var fe *LayoutFieldError
		if !errors.As(err, &fe) || fe.Field != c.field || !errors.Is(err, ErrInvalidLayout) {
			t.Errorf("%s: %v, want ErrInvalidLayout naming %s", c.name, err, c.field)
		}
	}
}

func TestPlanRanksChoosesOpaqueOrDescribed(t *testing.T) {
	opaque := UniformLayout(2, 16, 16*8*128, 4, 64)
	for _, c := range []struct {
		name            string
		prefill, decode Layout
	}{
		{"opaque both", opaque, UniformLayout(2, 99, 16*8*128, 7, 64)},
		{"opaque prefill, described decode", opaque, described()},
		{"described prefill, opaque decode", described(), opaque},
		{"described both", described(), described()},
	} {
		m, err := PlanRanks(c.prefill, c.decode)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !m.Identity() || len(m.DecodeRanks) != 1 || len(m.DecodeRanks[0].Copies) != 2 || m.DecodeRanks[0].ExpectedResponses() != 1 {
			t.Errorf("%s: mapping %+v, want the identity of 2 whole-page copies", c.name, m)
		}
		for _, cp := range m.DecodeRanks[0].Copies {
			if cp.SrcItemLen() != 16*8*128 {
				t.Errorf("%s: copy of %d bytes, want the page's %d", c.name, cp.SrcItemLen(), 16*8*128)
			}
		}
	}
}

// TestPlanRanksRefusesWithTheRankmapSentinel: the refusal the daemons log and count names
// what cannot map; a described pair goes to rankmap.Plan, an opaque one is compared whole.
func TestPlanRanksRefusesWithTheRankmapSentinel(t *testing.T) {
	tp2 := func(l Layout) Layout { l.Rank = Rank{TP: 1, Size: 2}; return l }
	for _, c := range []struct {
		name            string
		prefill, decode Layout
		want            error
	}{
		{"head bytes (dtype)", described(), UniformLayout(2, 16, 16*16*64, 4, 64).WithHeads(rankmap.MHA, 16, 16, 64), rankmap.ErrDtypeMismatch},
		{"page tokens", described(), UniformLayout(2, 16, 32*4*128, 4, 64).WithHeads(rankmap.MHA, 32, 4, 128), rankmap.ErrPageSizeMismatch},
		{"total heads", described(), UniformLayout(2, 16, 16*4*128, 4, 64).WithHeads(rankmap.MHA, 16, 4, 128), rankmap.ErrHeadCountMismatch},
		{"mla against mha", described(), UniformLayout(2, 16, 16*8*128, 4, 64).WithHeads(rankmap.MLA, 16, 8, 128), rankmap.ErrMixedAttention},
		{"opaque item_len", UniformLayout(2, 16, 4096, 4, 64), described(), rankmap.ErrPageSizeMismatch},
		{"opaque buffer count", UniformLayout(3, 16, 16*8*128, 4, 64), described(), rankmap.ErrBufferCountMismatch},
		{"opaque aux row", UniformLayout(2, 16, 16*8*128, 4, 32), UniformLayout(2, 16, 16*8*128, 4, 64), rankmap.ErrAuxRowMismatch},
		{"opaque tp fan-out", UniformLayout(2, 16, 16*8*128, 4, 64), tp2(UniformLayout(2, 16, 16*8*128, 4, 64)), ErrOpaqueTP},
	} {
		_, err := PlanRanks(c.prefill, c.decode)
		if !errors.Is(err, c.want) || !errors.Is(err, ErrIncompatibleLayout) {
			t.Errorf("%s: %v, want ErrIncompatibleLayout and %v", c.name, err, c.want)
		}
	}
	if _, err := PlanRanks(UniformLayout(0, 1, 1, 0, 0), described()); !errors.Is(err, ErrInvalidLayout) || !strings.HasPrefix(err.Error(), "prefill layout") {
		t.Errorf("invalid prefill layout: %v, want ErrInvalidLayout naming the side", err)
	}
}

// TestPlanRanksMapsDescribedFanOut: described layouts of different TP sizes reach
// rankmap.Plan (prefill 1 -> decode 2 splits heads), where opaque ones are refused.
func TestPlanRanksMapsDescribedFanOut(t *testing.T) {
	d := UniformLayout(2, 16, 16*4*128, 4, 64)
	d.Rank = Rank{TP: 0, Size: 2}
	d = d.WithHeads(rankmap.MHA, 16, 8, 128)
	m, err := PlanRanks(described(), d)
	if err != nil {
		t.Fatal(err)
	}
	if m.Identity() || len(m.DecodeRanks) != 2 || len(m.PrefillRanks[0].To) != 2 {
		t.Fatalf("mapping %+v, want prefill 0 feeding decode 0 and 1 by head slice", m)
	}
}

func TestRefusalReasonNamesEachSentinel(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range refusals {
		if got := RefusalReason(fmt.Errorf("%w: %w: buffer 0", ErrIncompatibleLayout, r.err)); got != r.reason {
			t.Errorf("%v: reason %q, want %q", r.err, got, r.reason)
		}
		if seen[r.reason] {
			t.Errorf("reason %q twice", r.reason)
		}
		seen[r.reason] = true
	}
	if got := RefusalReason(errors.New("x")); got != "other" {
		t.Errorf("an unknown error: %q, want other", got)
	}
}
