package service

import (
	"os"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/daemon"
	"github.com/pdlink/pdlink/pkg/pagelist"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// bigPagesRegion has more than 2^21 one-byte pages, so page numbers that need four varint
// bytes exist and a list of pagelist.MaxPages+1 pages is inside the buffer.
func bigPagesRegion(t *testing.T) region {
	t.Helper()
	l := transfer.UniformLayout(1, 1<<21+pagelist.MaxPages+1, 1, 2, 16)
	path, err := transfer.CreateRegionFile(t.TempDir(), l)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := transfer.OpenRegion(path, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close(); os.Remove(path) })
	return region{path, l, mem}
}

// largestListTimings gives a pair moving the largest lists room deadlines
// past the test's bounds: prefill sees no progress until the whole stream of
// MaxPages one-page runs is confirmed, which takes seconds on a loaded race
// build (timeout:transferring at the harness's 5 s; the list's RPCs come
// near the 5 s waiting deadline too).
func largestListTimings(pre, dec *daemon.Config) {
	for _, c := range []*daemon.Config{pre, dec} {
		c.BootstrapTimeout, c.WaitingTimeout, c.TransferIdleTimeout = time.Minute, time.Minute, time.Minute
	}
}

// TestLargestPageListGoesEndToEndAndOneMoreIsRefusedAtTheEdge: the page-list bounds are one
// set (package pagelist) on both daemons. A destination list at the bound (MaxPages indices
// one page apart, so also MaxPages runs on the data plane) is accepted by decode's
// SendMetadata, accepted by prefill's frame check and delivered to Success; a list one page
// or one run over the bound, or one whose indices would not fit a METADATA frame, is
// InvalidArgument at decode's gRPC edge, not a room that never binds.
func TestLargestPageListGoesEndToEndAndOneMoreIsRefusedAtTheEdge(t *testing.T) {
	p := startPairWith(t, largestListTimings)
	pre, dec := bigPagesRegion(t), bigPagesRegion(t)
	if _, err := p.prefill.RegisterRegion(ctxT(t), &pb.PrefillServiceRegisterRegionRequest{RegionPath: pre.path, Layout: layoutPB(pre.layout)}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.decode.RegisterRegion(ctxT(t), &pb.DecodeServiceRegisterRegionRequest{RegionPath: dec.path, Layout: layoutPB(dec.layout)}); err != nil {
		t.Fatal(err)
	}
	open := func(room uint64) {
		t.Helper()
		if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("over the bound is InvalidArgument", func(t *testing.T) {
		room := uint64(10)
		indices := func(n, from int) []int32 {
			out := make([]int32, n)
			for i := range out {
				out[i] = int32(from + i)
			}
			return out
		}
		spaced := make([]*pb.PageRun, pagelist.MaxRuns+1)
		for i := range spaced {
			spaced[i] = &pb.PageRun{Start: int32(2 * i), Count: 1}
		}
		for name, pl := range map[string]*pb.PageList{
			"one index over":           {Indices: indices(pagelist.MaxPages+1, 0)},
			"one page over in runs":    {Runs: []*pb.PageRun{{Start: 0, Count: pagelist.MaxPages + 1}}},
			"one run over":             {Runs: spaced},
			"indices too big to frame": {Indices: indices(pagelist.MaxPages, 1<<21)},
		} {
			room++ // a room each: an accepted list would make the next one a conflicting retry
			open(room)
			_, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: pl, AuxIndex: 1})
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("%s: SendMetadata: %v, want InvalidArgument", name, err)
			}
		}
		// The same pages as one run fit a frame.
		room++
		open(room)
		if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room,
			DstPages: &pb.PageList{Runs: []*pb.PageRun{{Start: 1 << 21, Count: pagelist.MaxPages}}}, AuxIndex: 1}); err != nil {
			t.Fatalf("the same pages as one run: %v", err)
		}
	})

	t.Run("at the bound goes end to end", func(t *testing.T) {
		const room = 8
		open(room)
		// Every other page: MaxPages indices that stay MaxPages runs of one page, and page
		// numbers below 2^21, so the METADATA frame is as large as the bounds allow.
		dst := make([]int32, pagelist.MaxPages)
		src := make([]int32, pagelist.MaxPages)
		for i := range dst {
			dst[i] = int32(2*i + 1)
			src[i] = int32(pagelist.MaxPages - i)
		}
		for i, pg := range src {
			pre.mem.Pages(0, transfer.Run{Start: pg, Count: 1})[0] = byte(i*7 + 1)
		}
		copy(pre.mem.AuxRow(0), "aux-row-at-limit")
		if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: dst}, AuxIndex: 1}); err != nil {
			t.Fatalf("SendMetadata of %d pages: %v", len(dst), err)
		}
		eventually(t, "prefill WaitingForInput", func() bool {
			ps, _ := pollState(t, p, room)
			return ps.State == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT
		})
		if _, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: src}, Last: true, AuxIndex: 0}); err != nil {
			t.Fatalf("Send of %d pages: %v", len(src), err)
		}
		waitBothSuccess(t, p, room)
		for i, pg := range dst {
			if got, want := dec.mem.Pages(0, transfer.Run{Start: pg, Count: 1})[0], byte(i*7+1); got != want {
				t.Fatalf("destination page %d holds %d, want %d (source page %d)", pg, got, want, src[i])
			}
		}
		if got := string(dec.mem.AuxRow(1)); got != "aux-row-at-limit" {
			t.Fatalf("aux row %q", got)
		}
	})
}
