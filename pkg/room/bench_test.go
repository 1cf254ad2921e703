package room

import (
	"testing"

	"github.com/pdlink/pdlink/pkg/poll"
)

// BenchmarkOwnerPoll1000 is a scheduler's Poll of 1000 rooms through the
// owner goroutine: one input queued, run and answered (goal < 100 us; the
// table alone is pkg/poll's BenchmarkPoll1000).
func BenchmarkOwnerPoll1000(b *testing.B) {
	h := newHarness(b, 7)
	ids := make([]poll.RoomID, 1000)
	for i := range ids {
		ids[i] = poll.RoomID(i + 1)
		if _, err := h.pre.Open(ids[i], 0, 0); err != nil {
			b.Fatal(err)
		}
	}
	out := make([]poll.State, 0, len(ids))
	b.ReportAllocs()
	for b.Loop() {
		out = h.pre.Poll(ids, out)
	}
	if len(out) != len(ids) || out[0] != poll.Bootstrapping {
		b.Fatalf("polled %d rooms, first %v", len(out), out[0])
	}
}
