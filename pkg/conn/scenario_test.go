package conn

import (
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/poll"
)

func TestHappyPathReachesSuccessOnBothSides(t *testing.T) {
	h := newHarness(t, 1)
	sub := h.dec.Subscribe(16)
	defer sub.Close()
	key := h.open(1, 1)
	if !h.waitBound(key, time.Second) {
		t.Fatalf("prefill never bound the room: pre %v dec %v", h.preState(1), h.decState(1))
	}
	if got := h.decState(1); got != poll.WaitingForInput {
		t.Fatalf("decode %v after metadata ack, want WaitingForInput", got)
	}
	h.transfer(key, 1)
	if _, ok := h.until(time.Second, func() bool { return h.bothTerminal(1) }); !ok {
		t.Fatalf("not terminal: pre %v dec %v", h.preState(1), h.decState(1))
	}
	h.expect(1, poll.Success, poll.Success)
	var tos []poll.State
	for len(sub.C()) > 0 {
		tos = append(tos, (<-sub.C()).To)
	}
	want := []poll.State{poll.Bootstrapping, poll.WaitingForInput, poll.Transferring, poll.Success}
	if len(tos) != len(want) {
		t.Fatalf("decode transitions %v, want %v", tos, want)
	}
	c := h.pre.Counters()
	if c.Frames(FrameMetadata, Received) != 1 || c.Frames(FrameStatus, Received) != 1 || c.RejectedTotal() != 0 {
		t.Fatalf("prefill counters: metadata %d status %d rejected %d", c.Frames(FrameMetadata, Received), c.Frames(FrameStatus, Received), c.RejectedTotal())
	}
	h.checkInvariants()
}
