package service

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
)

func TestWatchStreamsFilteredTransitions(t *testing.T) {
	p := startPair(t)
	stream, err := p.prefill.Watch(ctxT(t), &pb.PrefillServiceWatchRequest{Filter: &pb.WatchFilter{
		ToStates: []pb.RoomState{pb.RoomState_ROOM_STATE_FAILED}}})
	subscribed(t, stream, err)
	// Opens are filtered out; the abort's Failed comes through once fenced.
	for id := uint64(1); id <= 3; id++ {
		if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: id}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.prefill.Abort(ctxT(t), &pb.PrefillServiceAbortRequest{RoomId: 2}); err != nil {
		t.Fatal(err)
	}
	ev, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	tr := ev.Event.GetTransition()
	if tr == nil || tr.RoomId != 2 || tr.To != pb.RoomState_ROOM_STATE_FAILED || tr.Reason != "aborted:local" {
		t.Fatalf("first watched event %v, want room 2 -> Failed(aborted:local)", ev)
	}
}

// A reader that falls behind is told how many transitions it missed, so
// it can re-sync with Poll, and the daemon does not block on it.
func TestSlowWatcherIsToldWhatItMissed(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	watchBuffer = 4
	watchStall = func() { <-release } // the stream's goroutine is stuck until released
	t.Cleanup(func() { once.Do(func() { close(release) }); watchBuffer, watchStall = 0, nil })
	p := startPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream, err := p.decode.Watch(ctx, &pb.DecodeServiceWatchRequest{})
	subscribed(t, stream, err)
	registerRegions(t, p)
	// 20 rooms opened and aborted: 40 transitions against a buffer of 4,
	// while the stream is stuck. The daemon keeps serving meanwhile.
	for id := uint64(1); id <= 20; id++ {
		if _, err := p.decode.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: id, PrefillBootstrapAddr: p.bootstrap}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.decode.Abort(ctx, &pb.DecodeServiceAbortRequest{RoomId: id}); err != nil {
			t.Fatal(err)
		}
	}
	once.Do(func() { close(release) })
	var missed uint64
	for missed == 0 {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatalf("stream ended before any missed count: %v", err)
		}
		missed += ev.Event.GetMissed()
	}
	if missed < 20 {
		t.Fatalf("missed %d transitions, want most of the 40 that did not fit", missed)
	}
}

// pdlink_watch_dropped_total on each daemon's /metrics is the count of
// transitions its stalled Watch stream missed, exactly what the stream's
// "missed" event told the reader.
func TestWatchDroppedTotalCountsWhatASlowWatcherMissed(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	watchBuffer = 4
	watchStall = func() { <-release } // every stream's goroutine is stuck until released
	t.Cleanup(func() { once.Do(func() { close(release) }); watchBuffer, watchStall = 0, nil })
	p := startPair(t)
	registerRegions(t, p)
	for _, base := range []string{p.preHTTP, p.decHTTP} {
		if got := metric(t, base, "pdlink_watch_dropped_total"); got != "0" {
			t.Fatalf("%s: pdlink_watch_dropped_total %s before any watcher", base, got)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pre, err := p.prefill.Watch(ctx, &pb.PrefillServiceWatchRequest{})
	subscribed(t, pre, err)
	dec, err := p.decode.Watch(ctx, &pb.DecodeServiceWatchRequest{})
	subscribed(t, dec, err)
	// 20 rooms opened and aborted on each side (other ids on decode, so
	// its aborts reach no prefill room): 40 transitions per stream against
	// a buffer of 4 and one transition in the stuck goroutine's hands.
	const rooms, held = 20, 4 + 1
	for id := uint64(1); id <= rooms; id++ {
		if _, err := p.prefill.OpenSender(ctx, &pb.OpenSenderRequest{RoomId: id}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.prefill.Abort(ctx, &pb.PrefillServiceAbortRequest{RoomId: id}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.decode.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: 100 + id, PrefillBootstrapAddr: p.bootstrap}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.decode.Abort(ctx, &pb.DecodeServiceAbortRequest{RoomId: 100 + id}); err != nil {
			t.Fatal(err)
		}
	}
	once.Do(func() { close(release) })
	for _, s := range []struct {
		side, base string
		recv       func() (*pb.WatchEvent, error)
	}{
		{"prefill", p.preHTTP, func() (*pb.WatchEvent, error) {
			r, err := pre.Recv()
			return r.GetEvent(), err
		}},
		{"decode", p.decHTTP, func() (*pb.WatchEvent, error) {
			r, err := dec.Recv()
			return r.GetEvent(), err
		}},
	} {
		// Every abort returned once its Failed was published, so the
		// stream's first report after the release holds every drop.
		var missed uint64
		for missed == 0 {
			ev, err := s.recv()
			if err != nil {
				t.Fatalf("%s: stream ended before any missed count: %v", s.side, err)
			}
			missed = ev.GetMissed()
		}
		if missed < 2*rooms-held {
			t.Fatalf("%s: stream missed %d transitions, want at least %d", s.side, missed, 2*rooms-held)
		}
		if got := metric(t, s.base, "pdlink_watch_dropped_total"); got != fmt.Sprint(missed) {
			t.Fatalf("%s: pdlink_watch_dropped_total %s, the stream missed %d", s.side, got, missed)
		}
	}
}
