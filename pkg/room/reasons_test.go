package room

import (
	"testing"

	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// TestEveryTransferReasonHasARoomReason: each data-plane failure reason either fails the
// room with a reason Step accepts (stepped here on both sides exactly as the nodes' OnFailed
// steps it: EvAbortLocal with that reason) or, for fenced alone, leaves the reason to the
// control plane. A transfer reason added without a mapping, or mapped by a cast onto a
// string poll does not know, fails here instead of leaving rooms to wait out their idle
// deadline.
func TestEveryTransferReasonHasARoomReason(t *testing.T) {
	for _, tr := range transfer.AllReasons() {
		reason, fails, known := roomReason(tr)
		if !known {
			t.Errorf("transfer reason %q has no room reason", tr)
			continue
		}
		if !fails {
			if tr != transfer.ReasonFenced {
				t.Errorf("transfer reason %q does not fail the room: only fenced may leave the reason to the control plane", tr)
			}
			continue
		}
		for _, side := range []poll.Side{poll.Prefill, poll.Decode} {
			tab, err := poll.New(poll.DefaultConfig(side))
			if err != nil {
				t.Fatal(err)
			}
			key := poll.Key{Room: 1, Nonce: 7}
			if err := tab.Step(1, poll.Event{Kind: poll.EvOpen, Key: key, Peer: 1}); err != nil {
				t.Fatalf("%v: open: %v", side, err)
			}
			if err := tab.Step(2, poll.Event{Kind: poll.EvAbortLocal, Key: key, Reason: reason}); err != nil {
				t.Errorf("%v: transfer reason %q maps to room reason %q, which Step refuses: %v", side, tr, reason, err)
				continue
			}
			in, err := tab.Get(key.Room)
			if err != nil {
				t.Fatal(err)
			}
			if in.State != poll.Failed || in.Reason != reason {
				t.Errorf("%v: transfer reason %q: room is %v (%q), want Failed (%q)", side, tr, in.State, in.Reason, reason)
			}
		}
	}
}

// TestUnknownTransferReasonStillFailsTheRoom: a reason this build has no mapping for (a
// newer peer's, or one added without a mapping) fails the room with transfer_error at once.
func TestUnknownTransferReasonStillFailsTheRoom(t *testing.T) {
	reason, fails := roomFailure(zap.NewNop(), transfer.Reason("stalled"))
	if !fails || reason != poll.ReasonTransferError {
		t.Fatalf("unknown transfer reason: fails %v with %q, want the room failed with transfer_error", fails, reason)
	}
}
