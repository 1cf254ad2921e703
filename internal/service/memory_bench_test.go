package service

import (
	"context"
	"flag"
	"runtime"
	"testing"
	"time"

	"github.com/pdlink/pdlink/internal/daemon"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
)

var memoryRooms = flag.Int("memory-rooms", 10_000, "rooms BenchmarkDaemonMemoryPerLiveRoom opens")

// BenchmarkDaemonMemoryPerLiveRoom measures what a live room costs across
// the whole daemons, not the room table alone (pkg/poll's
// BenchmarkMemoryPerRoom100k): every map, binding, expectation and control
// frame kept for it in the room owners, the data planes and the link. Both
// daemons run in this process, so the heap after GC is theirs plus a
// constant. It opens benchRooms rooms through gRPC in three phases and
// reports the heap per room each added:
//
//   - prefill-open-B/room: OpenSender (prefill, Bootstrapping);
//   - decode-open-B/room: OpenReceiver (decode, Bootstrapping);
//   - bound-B/room: SendMetadata, until both sides are WaitingForInput
//     (decode's expectation and METADATA, prefill's binding);
//   - B/room: all three, one bound room on both daemons;
//   - poll1000-us: a scheduler's Poll of 1000 of those rooms over gRPC.
//
// Run it with -run '^$' -bench DaemonMemoryPerLiveRoom -benchtime 1x; add
// -args -memory-rooms=100000 for issue 12's target size (about a minute).
func BenchmarkDaemonMemoryPerLiveRoom(b *testing.B) {
	benchRooms := *memoryRooms
	for b.Loop() {
		p := startPairWith(b, func(pre, dec *daemon.Config) {
			for _, c := range []*daemon.Config{pre, dec} {
				c.BootstrapTimeout, c.WaitingTimeout, c.MaxRooms = 10*time.Minute, 10*time.Minute, 2*benchRooms
			}
		})
		_, dec := registerRegions(b, p)
		pages := dec.layout.Buffers[0].Pages()
		ids := make([]uint64, benchRooms)
		for i := range ids {
			ids[i] = uint64(i + 1)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		// each calls one RPC per room from a few goroutines, as schedulers do.
		each := func(call func(ctx context.Context, i int) error) {
			inParallel(b, 8, len(ids), func(i int) error { return call(ctx, i) })
		}
		heap := func() uint64 {
			var m runtime.MemStats
			runtime.GC()
			runtime.GC() // the second cycle frees what sync.Pools let go of in the first
			runtime.ReadMemStats(&m)
			return m.HeapAlloc
		}
		base := heap()
		each(func(ctx context.Context, i int) error {
			_, err := p.prefill.OpenSender(ctx, &pb.OpenSenderRequest{RoomId: ids[i]})
			return err
		})
		prefillOpen := heap()
		each(func(ctx context.Context, i int) error {
			_, err := p.decode.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: ids[i], PrefillBootstrapAddr: p.bootstrap})
			return err
		})
		decodeOpen := heap()
		each(func(ctx context.Context, i int) error {
			_, err := p.decode.SendMetadata(ctx, &pb.SendMetadataRequest{RoomId: ids[i],
				DstPages: &pb.PageList{Indices: []int32{int32(int64(i) % pages)}}, AuxIndex: uint32(int64(i) % dec.layout.Aux.Rows)})
			return err
		})
		// Poll takes at most 65536 ids: ask in batches, as a scheduler would.
		const batch = 1 << 14
		boundOnBoth := func() int {
			waiting := 0
			for at := 0; at < len(ids); at += batch {
				some := ids[at:min(at+batch, len(ids))]
				pr, err := p.prefill.Poll(ctx, &pb.PrefillServicePollRequest{RoomIds: some})
				if err != nil {
					b.Fatal(err)
				}
				dr, err := p.decode.Poll(ctx, &pb.DecodeServicePollRequest{RoomIds: some})
				if err != nil {
					b.Fatal(err)
				}
				for i := range some {
					if pr.Statuses[i].State == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT && dr.Statuses[i].State == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT {
						waiting++
					}
				}
			}
			return waiting
		}
		for {
			waiting := boundOnBoth()
			if waiting == len(ids) {
				break
			}
			if ctx.Err() != nil {
				b.Fatalf("%d of %d rooms bound on both sides", waiting, len(ids))
			}
			time.Sleep(20 * time.Millisecond)
		}
		bound := heap()
		const polls = 200
		began := time.Now()
		for i := range polls {
			at := i * 1000 % (len(ids) - 1000)
			if _, err := p.prefill.Poll(ctx, &pb.PrefillServicePollRequest{RoomIds: ids[at : at+1000]}); err != nil {
				b.Fatal(err)
			}
		}
		pollTook := time.Since(began) / polls
		cancel()
		per := func(from, to uint64) float64 { return (float64(to) - float64(from)) / float64(benchRooms) }
		b.ReportMetric(per(base, prefillOpen), "prefill-open-B/room")
		b.ReportMetric(per(prefillOpen, decodeOpen), "decode-open-B/room")
		b.ReportMetric(per(decodeOpen, bound), "bound-B/room")
		b.ReportMetric(per(base, bound), "B/room")
		b.ReportMetric(float64(pollTook.Microseconds()), "poll1000-us")
		p.stop(b)
	}
}
