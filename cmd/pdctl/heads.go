package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pdlink/pdlink/internal/sim"
)

// addHeadFlags adds the knobs that describe a page's heads (RegionLayout's head fields).
func addHeadFlags(f *pflag.FlagSet, l *sim.Layout) {
	f.IntVar(&l.HeadDim, "head-dim", l.HeadDim, "elements per KV head; with --dtype-bytes it splits each buffer's token row into heads (0: an opaque layout)")
	f.IntVar(&l.DtypeBytes, "dtype-bytes", l.DtypeBytes, "bytes per KV element (2 for bf16)")
}

// fitHeads checks the head knobs against --bytes-per-token and --layers. Given on the
// command line they must fit; left at their defaults they describe the layout when they
// fit and leave it opaque otherwise (a small --bytes-per-token for small rooms).
func fitHeads(cmd *cobra.Command, l *sim.Layout) error {
	if l.HeadsFit() {
		return nil
	}
	f := cmd.Flags()
	if f.Changed("head-dim") || f.Changed("dtype-bytes") {
		return fmt.Errorf("--bytes-per-token %d over %d buffers is not whole heads of --head-dim %d x --dtype-bytes %d",
			l.BytesPerToken, 2*l.Layers, l.HeadDim, l.DtypeBytes)
	}
	l.HeadDim, l.DtypeBytes = 0, 0
	return nil
}

// describeHeads is the layout line's note on the head shape: the model's
// heads, and, split over TP ranks, what one decode rank of decodeTP holds.
func describeHeads(l sim.Layout, decodeTP int) string {
	if l.HeadDim == 0 {
		return "opaque"
	}
	row := l.BytesPerToken / int64(2*l.Layers)
	heads := row / int64(l.HeadDim*l.DtypeBytes)
	out := fmt.Sprintf("%d kv heads x %d x %d B", heads, l.HeadDim, l.DtypeBytes)
	if tl, err := l.RankTransfer(0, decodeTP); err == nil && decodeTP > 1 && tl.Buffers[0].RankHeads != tl.Buffers[0].TotalHeads {
		out += fmt.Sprintf(", %d per decode rank", tl.Buffers[0].RankHeads)
	}
	return out
}
