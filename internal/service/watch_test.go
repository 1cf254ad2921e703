package service

import (
	"context"
	"sync"
	"testing"
	"time"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
)

func TestWatchStreamsFilteredTransitions(t *testing.T) {
	p := startPair(t)
	stream, err := p.prefill.Watch(ctxT(t), &pb.PrefillServiceWatchRequest{Filter: &pb.WatchFilter{
		ToStates: []pb.RoomState{pb.RoomState_ROOM_STATE_FAILED}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Header(); err != nil { // subscribed from here on
		t.Fatal(err)
	}
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
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Header(); err != nil {
		t.Fatal(err)
	}
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
