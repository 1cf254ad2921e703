package room

import (
	"context"
	"testing"
	"time"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
)

// After its last Send a prefill room waits for its pages to move, which takes long behind
// other rooms or over a slow link. Its transfer-idle deadline must count the chunks the
// data plane writes, not only the scheduler's Sends: a room whose stream keeps moving for
// several idle timeouts stays Transferring, and one whose stream stops fails at the next
// (timeout:transferring).
func TestPrefillRoomWhoseStreamKeepsMovingIsNotIdle(t *testing.T) {
	tr := newFakeTransport(true)
	h := newHarnessOverTransport(t, tr)
	const room = 5
	key := h.open(room, 1)
	if _, ok := h.until(tBound, func() bool { return h.preState(room) == poll.WaitingForInput }); !ok {
		t.Fatalf("prefill room %d is %v, want WaitingForInput", room, h.preState(room))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.pre.Send(ctx, &pdlinkv1.SendRequest{RoomId: room, Pages: &pdlinkv1.PageList{Indices: []int32{0, 1, 2}}, Last: true, AuxIndex: 1}); err != nil {
		t.Fatalf("last Send: %v", err)
	}
	st, ok := tr.stream(room)
	if !ok || st.Progress == nil {
		t.Fatalf("the room's stream (opened %v) reports no progress to the owner", ok)
	}
	// Three idle timeouts of chunks written every quarter of one. Decode hears bytes too
	// (its own deadline is not the point here).
	for el := time.Duration(0); el < 3*tIdle; el += tIdle / 4 {
		st.Progress(4096)
		h.dec.OnProgress(key)
		h.advance(tIdle / 4)
		if s := h.preState(room); s != poll.Transferring {
			t.Fatalf("prefill room %d is %v %v after its last Send with its stream moving, want Transferring", room, s, el)
		}
	}
	// The stream stops: idle.
	if _, ok := h.until(tBound, func() bool { return h.preState(room) == poll.Failed }); !ok {
		t.Fatalf("prefill room %d is %v with its stream stopped, want Failed at its idle deadline", room, h.preState(room))
	}
	if info, err := h.pre.Get(room); err != nil || info.Reason != poll.ReasonTimeoutTransferring {
		t.Fatalf("prefill room %d ended %v (%v), want %s", room, info.Reason, err, poll.ReasonTimeoutTransferring)
	}
}
