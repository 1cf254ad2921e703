package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/pdlink/pdlink/internal/proc"
	"github.com/pdlink/pdlink/internal/sim"
)

// addRankFlags adds the engines' tensor-parallel shape: one simulated
// scheduler, region file and set of pages per rank on each side.
func addRankFlags(f *pflag.FlagSet, cfg *sim.Config) {
	f.IntVar(&cfg.PrefillTP, "prefill-tp", 1, "prefill engine's TP size: one simulated scheduler per rank, each with its own region file and pages")
	f.IntVar(&cfg.DecodeTP, "decode-tp", 1, "decode engine's TP size: one simulated scheduler per rank, each with its own region file and pages")
	f.BoolVar(&cfg.Layout.MLA, "mla", false, "MLA attention: every rank holds the whole latent (replicated heads) instead of its share of the KV heads")
}

// checkRanks refuses TP sizes below 1 before any daemon starts.
func checkRanks(cfg sim.Config) error {
	if cfg.PrefillTP < 1 || cfg.DecodeTP < 1 {
		return fmt.Errorf("--prefill-tp %d --decode-tp %d: both must be at least 1", cfg.PrefillTP, cfg.DecodeTP)
	}
	return nil
}

// describeRanks is the layout line's note on the TP shape ("" at TP 1).
func describeRanks(cfg sim.Config) string {
	attention := "mha"
	if cfg.Layout.MLA {
		attention = "mla"
	}
	if cfg.PrefillTP == 1 && cfg.DecodeTP == 1 && !cfg.Layout.MLA {
		return ""
	}
	return fmt.Sprintf(", %s tp %d -> %d", attention, cfg.PrefillTP, cfg.DecodeTP)
}

// rankResult is one rank's share of a run in `pdctl bench --json`: the
// successful rooms it moved bytes for, those bytes (sent by a prefill
// rank, landed on a decode rank), and the page positions (its scheduler
// handed over in Sends, landed).
type rankResult struct {
	Rank        int     `json:"rank"`
	Rooms       int     `json:"rooms"`
	RoomsPerSec float64 `json:"rooms_per_s"`
	Bytes       int64   `json:"bytes"`
	Pages       int64   `json:"pages"`
	GBps        float64 `json:"gb_per_s"`
}

func rankResults(ranks []sim.RankReport, elapsed time.Duration) []rankResult {
	out := make([]rankResult, len(ranks))
	for i, r := range ranks {
		out[i] = rankResult{Rank: r.Rank, Rooms: r.Rooms, Bytes: r.Bytes, Pages: r.Pages, GBps: r.GBps(elapsed)}
		if elapsed > 0 {
			out[i].RoomsPerSec = float64(r.Rooms) / elapsed.Seconds()
		}
	}
	return out
}

// printRanks writes one line per side listing each rank's rooms/s and
// GB/s; nothing at TP 1, where the totals say it all.
func printRanks(out io.Writer, prefill, decode []rankResult) {
	if len(prefill) <= 1 && len(decode) <= 1 {
		return
	}
	for _, side := range []struct {
		name  string
		ranks []rankResult
	}{{"prefill", prefill}, {"decode", decode}} {
		var parts []string
		for _, r := range side.ranks {
			parts = append(parts, fmt.Sprintf("%d: %.1f rooms/s %.2f GB/s", r.Rank, r.RoomsPerSec, r.GBps))
		}
		fmt.Fprintf(out, "  %-8s per rank  %s\n", side.name, strings.Join(parts, " | "))
	}
}

// noRoomSucceeded is the error of a run in which every room failed: the
// daemons refused the workload (a rank mapping they cannot serve, a
// layout they refuse), and the outcomes they gave say why, with prefilld's
// own reason when it refused to bind the rooms (a room fails just
// "invalid" on the scheduler API; the daemon logs which mapping).
func noRoomSucceeded(rep *sim.Report, procs []*proc.Process) error {
	if rep.Requests == 0 || rep.Outcomes["decode:success"] > 0 {
		return nil
	}
	keys := make([]string, 0, len(rep.Outcomes))
	for k := range rep.Outcomes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s x%d", k, rep.Outcomes[k]))
	}
	msg := strings.Join(parts, ", ")
	if rep.FirstError != "" {
		msg += "; first refusal: " + rep.FirstError
	}
	for _, p := range procs {
		if why := p.LogField("cannot bind room to decode peer", "error"); why != "" {
			msg += "; " + p.Name + ": " + why
			break
		}
	}
	return fmt.Errorf("no room succeeded (%s)", msg)
}
