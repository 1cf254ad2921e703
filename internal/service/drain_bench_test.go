package service

import (
	"context"
	"flag"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/daemon"
	"github.com/pdlink/pdlink/internal/testbed"
)

var drainBenchRooms = flag.Int("drain-rooms", 10_000, "live rooms BenchmarkPrefillDrainFailsLiveRoomsByItsCap drains")

// BenchmarkPrefillDrainFailsLiveRoomsByItsCap stops prefilld (its context
// ends, as on SIGTERM) with drain-rooms live rooms bound to decoded, over
// the real ZeroMQ link and data plane, and reads the drain's own report:
// how many of the rooms failed at the deadline were still not visible as
// Failed when it ended (invisible, at the cap: deadline + 500 ms), how
// many notices decode had not acknowledged, and how long the drain ran
// past its deadline. Run it with -run '^$' -bench PrefillDrainFailsLiveRooms
// -benchtime 1x; add -args -drain-rooms=100000 for issue 12's size.
func BenchmarkPrefillDrainFailsLiveRoomsByItsCap(b *testing.B) {
	n := *drainBenchRooms
	var invisible, unacked, after float64
	for range b.N {
		b.StopTimer()
		core, logs := observer.New(zap.InfoLevel)
		p := startPairLogged(b, core, func(pre, dec *daemon.Config) {
			for _, c := range []*daemon.Config{pre, dec} {
				c.BootstrapTimeout, c.WaitingTimeout, c.MaxRooms = 10*time.Minute, 10*time.Minute, 2*n
			}
			pre.DrainTimeout = 100 * time.Millisecond
		})
		_, dec := registerRegions(b, p)
		pages := dec.layout.Buffers[0].Pages()
		deadline := time.Now().Add(5 * time.Minute)
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		each := func(call func(i int) error) { inParallel(b, 8, n, call) }
		each(func(i int) error {
			_, err := p.prefill.OpenSender(ctx, &pb.OpenSenderRequest{RoomId: uint64(i + 1)})
			return err
		})
		each(func(i int) error {
			_, err := p.decode.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: uint64(i + 1), PrefillBootstrapAddr: p.bootstrap})
			return err
		})
		each(func(i int) error {
			_, err := p.decode.SendMetadata(ctx, &pb.SendMetadataRequest{RoomId: uint64(i + 1),
				DstPages: &pb.PageList{Indices: []int32{int32(int64(i) % pages)}}, AuxIndex: uint32(int64(i) % dec.layout.Aux.Rows)})
			return err
		})
		bound := func() int {
			waiting := 0
			ids := make([]uint64, 0, 1<<14)
			for at := 0; at < n; at += 1 << 14 {
				ids = ids[:0]
				for i := at; i < min(at+1<<14, n); i++ {
					ids = append(ids, uint64(i+1))
				}
				pr, err := p.prefill.Poll(ctx, &pb.PrefillServicePollRequest{RoomIds: ids})
				if err != nil {
					b.Fatal(err)
				}
				for _, st := range pr.Statuses {
					if st.State == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT {
						waiting++
					}
				}
			}
			return waiting
		}
		if _, ok := testbed.Eventually(time.Until(deadline), func() bool { return bound() == n }); !ok {
			b.Fatalf("%d of %d rooms bound on prefill", bound(), n)
		}
		cancel()

		b.StartTimer()
		p.stopPre()
		if err := <-p.preDone; err != nil {
			b.Errorf("prefilld stopped with %v", err)
		}
		b.StopTimer()
		p.stopPre = nil
		var rep map[string]any
		for _, e := range logs.FilterMessage("drain finished").All() {
			rep = e.ContextMap()
		}
		if rep == nil {
			b.Fatal("prefilld logged no drain report")
		}
		if got := rep["rooms_failed"].(int64); got != int64(n) {
			b.Errorf("the drain failed %d rooms, want %d", got, n)
		}
		invisible += float64(rep["rooms_invisible"].(int64))
		unacked += float64(rep["notices_unacknowledged"].(int64))
		after += float64(rep["after_deadline"].(time.Duration).Milliseconds())
		p.stop(b)
	}
	b.ReportMetric(invisible/float64(b.N), "invisible-at-cap")
	b.ReportMetric(unacked/float64(b.N), "unacked-notices")
	b.ReportMetric(after/float64(b.N), "ms-after-deadline")
}

// startPairLogged is startPairWith whose daemons also log into extra
// (the drain's report is an Info line).
func startPairLogged(t testing.TB, extra zapcore.Core, tweak func(pre, dec *daemon.Config)) *pair {
	t.Helper()
	return startPairLoggingTo(t, zap.New(extra), tweak)
}
