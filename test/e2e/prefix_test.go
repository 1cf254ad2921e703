package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pdlink/pdlink/internal/sim"
)

// The simulated prefill scheduler reads decode's prefix back from its room
// (RoomStatus.prefix_len) as SGLang's prefill does and sends only the pages
// after it, through real daemons. Two workloads on one Sim, as pdctl runs
// them: with no prefix, prefill hands over exactly what lands; with half of
// each room decode's already, it still hands over exactly what lands, and
// the prefix moved nothing. At TP 1 (a Send per layer) and at MHA 2 -> 4
// (each decode rank half of one prefill rank's heads): every byte verified,
// both daemons' byte counters equal to what landed.
func TestSimPrefillSendsOnlyThePagesAfterDecodesPrefix(t *testing.T) {
	for _, c := range []struct {
		prefill, decode int
		layerWise       bool
	}{{1, 1, true}, {2, 4, false}} {
		t.Run(fmt.Sprintf("tp%d_to_%d", c.prefill, c.decode), func(t *testing.T) {
			pre, dec, cfg := pairProcs(t)
			cfg.PrefillTP, cfg.DecodeTP, cfg.LayerWise = c.prefill, c.decode, c.layerWise
			cfg.Requests, cfg.Concurrency, cfg.MinTokens, cfg.MaxTokens = 16, 4, 64, 512
			cfg.PinBound = 30 * time.Second
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			s, err := sim.New(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			var moved int64 // bytes landed over both workloads
			for _, fraction := range []float64{0, 0.5} {
				w := cfg
				w.PrefixFraction = fraction
				rep, err := s.Run(ctx, w)
				if err != nil {
					t.Fatalf("prefix fraction %v: %v", fraction, err)
				}
				everyRoomVerified(t, rep)
				moved += rep.Bytes
				if got := rep.PrefixPages > 0; got != (fraction > 0) {
					t.Fatalf("prefix fraction %v: decode held %d prefix pages", fraction, rep.PrefixPages)
				}
				// Each prefill rank feeds decode/prefill decode ranks: it hands
				// over each position once for all of them.
				fan := int64(c.decode / c.prefill)
				if rep.SentPages*fan != rep.LandedPages || rep.SentBytes != rep.Bytes {
					t.Errorf("prefix fraction %v: prefill sent %d pages (%d bytes), decode wrote %d (%d bytes) and held %d prefix pages; want prefill to send only what decode wrote",
						fraction, rep.SentPages, rep.SentBytes, rep.LandedPages, rep.Bytes, rep.PrefixPages)
				}
				for _, r := range rep.PrefillRanks {
					if d := rep.DecodeRanks[r.Rank*int(fan)]; r.Pages != d.Pages {
						t.Errorf("prefix fraction %v: prefill rank %d sent %d pages, decode rank %d wrote %d", fraction, r.Rank, r.Pages, d.Rank, d.Pages)
					}
				}
			}
			// prefilld counts a head-slice share by the bytes it lands, not by the
			// whole source pages it reads them from (it counted twice what landed at 2 -> 4).
			sides := []struct{ http, label string }{{dec.HTTPAddr, "decode"}, {pre.HTTPAddr, "prefill"}}
			for _, side := range sides {
				if got := metric(t, side.http, `pdlink_transfer_bytes_total{side="`+side.label+`"}`); int64(got) != moved {
					t.Errorf("%s's transfer_bytes_total is %.0f, the rooms landed %d", side.label, got, moved)
				}
			}
		})
	}
}
