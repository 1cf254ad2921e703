package room

import (
	"context"
	"testing"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// BenchmarkPrefillSendRetry is the fixed cost of one prefill Send through
// the owner: the edge checks, the region-file stat (BenchmarkRegionCheck
// in pkg/transfer measures it alone), one owner input and the room's
// checks, over a transport that takes every piece. Each iteration repeats
// the room's first chunk, which the room answers as the retry it is, so
// no pages move and the cost is what every Send pays before its bytes.
func BenchmarkPrefillSendRetry(b *testing.B) {
	h := newHarnessOverTransport(b, newFakeTransport(true))
	const room = 7
	h.open(room, 1)
	if _, ok := h.until(tBound, func() bool { return h.preState(room) == poll.WaitingForInput }); !ok {
		b.Fatalf("prefill room %d is %v, want WaitingForInput", room, h.preState(room))
	}
	req := &pdlinkv1.SendRequest{RoomId: room, Pages: &pdlinkv1.PageList{Indices: []int32{0}}}
	ctx := context.Background()
	if err := h.pre.Send(ctx, req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := h.pre.Send(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

var _ transfer.Transport = (*fakeTransport)(nil)
