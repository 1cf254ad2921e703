package service

import (
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
	watchBuffer = 4
	t.Cleanup(func() { watchBuffer = 0 })
	p := startPair(t)
	stream, err := p.decode.Watch(ctxT(t), &pb.DecodeServiceWatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Header(); err != nil {
		t.Fatal(err)
	}
	registerRegions(t, p)
	// Many transitions while nobody reads: open and abort rooms quickly.
	for id := uint64(1); id <= 300; id++ {
		if _, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: id, PrefillBootstrapAddr: p.bootstrap}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.decode.Abort(ctxT(t), &pb.DecodeServiceAbortRequest{RoomId: id}); err != nil {
			t.Fatal(err)
		}
	}
	var missed uint64
	deadline := time.Now().Add(10 * time.Second)
	for missed == 0 && time.Now().Before(deadline) {
		ev, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		missed += ev.Event.GetMissed()
	}
	if missed == 0 {
		t.Fatal("slow watcher was never told it missed transitions")
	}
	// The daemon kept serving while the watcher lagged.
	if _, err := p.decode.Poll(ctxT(t), &pb.DecodeServicePollRequest{RoomIds: []uint64{300}}); err != nil {
		t.Fatal(err)
	}
}
