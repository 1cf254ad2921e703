package rankmap

import (
	"fmt"
	"testing"
)

// WholePages is the one answer both daemons take on how a decode rank's stream moves:
// whole pages from one prefill rank exactly when its row is what that rank holds (equal TP,
// MLA, a replicated head its source holds alone), head slices otherwise.
func TestWholePagesExactlyWhenARankReadsOneSourceRowAsIs(t *testing.T) {
	for _, c := range []struct {
		p, d  Topology
		whole bool
	}{
		{mhaSide(2, 8), mhaSide(2, 8), true},
		{mlaSide(2), mlaSide(4), true},
		{mlaSide(4), mlaSide(1), true},
		{mhaSide(2, 2), mhaSide(4, 2), true},  // each decode rank's one head, whole on its source
		{mhaSide(1, 1), mhaSide(2, 1), true},  // MQA
		{mhaSide(4, 2), mhaSide(2, 2), true},  // from the first replica; the second is a dummy
		{mhaSide(1, 2), mhaSide(4, 2), false}, // one of the source's two heads
		{mhaSide(2, 4), mhaSide(8, 4), false},
		{mhaSide(4, 2), mhaSide(1, 2), false}, // heads of two sources merge
		{mhaSide(2, 8), mhaSide(4, 8), false},
		{mhaSide(4, 8), mhaSide(2, 8), false},
	} {
		t.Run(fmt.Sprintf("%v %d heads %d -> %d", c.p.Attention, c.p.Buffers[0].TotalHeads, c.p.TP, c.d.TP), func(t *testing.T) {
			m, err := Plan(c.p, c.d)
			if err != nil {
				t.Fatal(err)
			}
			for _, dr := range m.DecodeRanks {
				if got := dr.WholePages(); got != c.whole {
					t.Fatalf("decode rank %d (from %v, copies %+v): WholePages %v, want %v", dr.Rank, dr.From, dr.Copies, got, c.whole)
				}
			}
		})
	}
}
