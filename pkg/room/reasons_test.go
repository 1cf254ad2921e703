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
	for _, side := range []poll.Side{poll.Prefill, poll.Decode} {
		for _, tr := range transfer.AllReasons() {
			reason, fails, known := roomReason(side, tr)
			if !known {
				t.Errorf("%v: transfer reason %q has no room reason", side, tr)
				continue
			}
			if !fails {
				if tr != transfer.ReasonFenced && (side != poll.Decode || tr != transfer.ReasonRegionReplaced) {
					t.Errorf("%v: transfer reason %q does not fail the room: only fenced, and region_replaced on decode, may leave the reason to the control plane", side, tr)
				}
				continue
			}
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

// TestTransferReasonsMapAsTheGoldenTable pins what each data-plane reason does to a room
// on each side. region_replaced is the same-host path's "prefill's file was replaced or
// removed" (decode's per-chunk stat): prefill fails its room region_replaced, as when it
// notices the replacement itself, and decode leaves its room to prefill's ABORT
// (aborted:remote naming region_replaced), so the event reads as on TCP.
func TestTransferReasonsMapAsTheGoldenTable(t *testing.T) {
	type mapped struct {
		reason poll.Reason
		fails  bool
	}
	golden := map[poll.Side]map[transfer.Reason]mapped{
		poll.Prefill: {
			transfer.ReasonChecksum:       {poll.ReasonChecksum, true},
			transfer.ReasonTransferError:  {poll.ReasonTransferError, true},
			transfer.ReasonInvalid:        {poll.ReasonInvalid, true},
			transfer.ReasonFenced:         {poll.ReasonNone, false},
			transfer.ReasonRegionReplaced: {poll.ReasonRegionReplaced, true},
		},
		poll.Decode: {
			transfer.ReasonChecksum:       {poll.ReasonChecksum, true},
			transfer.ReasonTransferError:  {poll.ReasonTransferError, true},
			transfer.ReasonInvalid:        {poll.ReasonInvalid, true},
			transfer.ReasonFenced:         {poll.ReasonNone, false},
			transfer.ReasonRegionReplaced: {poll.ReasonNone, false},
		},
	}
	for side, table := range golden {
		if len(table) != len(transfer.AllReasons()) {
			t.Errorf("%v: golden table has %d reasons, transfer has %d: add the new one here", side, len(table), len(transfer.AllReasons()))
		}
		for tr, want := range table {
			reason, fails, known := roomReason(side, tr)
			if got := (mapped{reason, fails}); !known || got != want {
				t.Errorf("%v: transfer reason %q maps to %+v (known %v), want %+v", side, tr, got, known, want)
			}
		}
	}
}

// TestUnknownTransferReasonStillFailsTheRoom: a reason this build has no mapping for (a
// newer peer's, or one added without a mapping) fails the room with transfer_error at once.
func TestUnknownTransferReasonStillFailsTheRoom(t *testing.T) {
	for _, side := range []poll.Side{poll.Prefill, poll.Decode} {
		reason, fails := roomFailure(zap.NewNop(), side, transfer.Reason("stalled"))
		if !fails || reason != poll.ReasonTransferError {
			t.Fatalf("%v: unknown transfer reason: fails %v with %q, want the room failed with transfer_error", side, fails, reason)
		}
	}
}
