package service

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/daemon"
)

// oldFeedBuffer was the buffer of the subscription the duration
// histograms hung on before the owner's Ended hook fed them: rooms ending
// in one owner step beyond it, while its reader waited for that step (it
// asked the owner for each room's history), were never observed.
const oldFeedBuffer = 4096

// sampleSum adds up, over family name on base's /metrics, the samples whose
// labels include want: a histogram's _count, a counter's value.
func sampleSum(t *testing.T, base, name string, want map[string]string) float64 {
	t.Helper()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(strings.NewReader(httpGet(t, base+"/metrics")))
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
next:
	for _, m := range mfs[name].GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch mfs[name].GetType() {
		case dto.MetricType_HISTOGRAM:
			sum += float64(m.GetHistogram().GetSampleCount())
		default:
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

// pdlink_room_duration_seconds counts every room that ends: decode rooms,
// more than the old feed's buffer, all fail in one owner step (their
// region unregistered) while a Watch stream is stuck, and the failed
// outcome's _count is the number of rooms, as is room_transitions_total
// into Failed; a room that succeeds after them is observed in both
// histograms.
func TestDurationHistogramsCountEveryRoomThatEnds(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	watchBuffer = 4
	watchStall = func() { <-release }
	t.Cleanup(func() { once.Do(func() { close(release) }); watchBuffer, watchStall = 0, nil })
	// Nothing times out meanwhile: the rooms end in the one step.
	p := startPairWith(t, func(pre, dec *daemon.Config) {
		for _, c := range []*daemon.Config{pre, dec} {
			c.BootstrapTimeout, c.WaitingTimeout = 5*time.Minute, 5*time.Minute
		}
	})
	pre, dec := registerRegions(t, p)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	stream, err := p.decode.Watch(ctx, &pb.DecodeServiceWatchRequest{})
	subscribed(t, stream, err)

	const rooms = oldFeedBuffer + 200
	inParallel(t, 4, rooms, func(i int) error {
		id := uint64(i + 1)
		if _, err := p.prefill.OpenSender(ctx, &pb.OpenSenderRequest{RoomId: id}); err != nil {
			return err
		}
		if _, err := p.decode.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: id, PrefillBootstrapAddr: p.bootstrap}); err != nil {
			return err
		}
		_, err := p.decode.SendMetadata(ctx, &pb.SendMetadataRequest{RoomId: id, DstPages: &pb.PageList{Indices: pages(0, 2)}})
		return err
	})
	r, err := p.decode.UnregisterRegion(ctx, &pb.DecodeServiceUnregisterRegionRequest{Rank: &pb.Rank{TpRank: 0, TpSize: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if r.RoomsFailed != rooms {
		t.Fatalf("UnregisterRegion failed %d rooms, want %d", r.RoomsFailed, rooms)
	}
	// The Ended hook observed every room in the owner step that failed
	// them, before UnregisterRegion answered: one read, no wait (a feed that
	// drops what its buffer cannot hold fails here).
	failed := map[string]string{"side": "decode", "outcome": "failed"}
	if n := sampleSum(t, p.decHTTP, "pdlink_room_duration_seconds", failed); n != rooms {
		t.Fatalf("pdlink_room_duration_seconds_count{outcome=failed} %v, want the %d rooms that failed", n, rooms)
	}
	if n := sampleSum(t, p.decHTTP, "pdlink_room_transitions_total", map[string]string{"to": "Failed"}); n != rooms {
		t.Fatalf("pdlink_room_transitions_total{to=Failed} %v, want %d", n, rooms)
	}
	// The stuck stream lost them: Watch is lossy, the histograms are not.
	if d := sampleSum(t, p.decHTTP, "pdlink_watch_dropped_total", nil); d < rooms {
		t.Fatalf("pdlink_watch_dropped_total %v, want the stuck stream to have lost at least %d", d, rooms)
	}
	once.Do(func() { close(release) })

	registerSide(t, p, "decode", dec)
	runRoom(t, p, pre, dec, rooms+1, pages(16, 4), pages(8, 4))
	for _, s := range []struct{ side, base string }{{"prefill", p.preHTTP}, {"decode", p.decHTTP}} {
		if n := sampleSum(t, s.base, "pdlink_room_duration_seconds", map[string]string{"outcome": "success"}); n != 1 {
			t.Errorf("%s: pdlink_room_duration_seconds_count{outcome=success} %v, want 1", s.side, n)
		}
		if n := sampleSum(t, s.base, "pdlink_transfer_duration_seconds", nil); n != 1 {
			t.Errorf("%s: pdlink_transfer_duration_seconds_count %v, want 1", s.side, n)
		}
	}
}
