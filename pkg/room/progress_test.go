package room

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// admittingTransport admits every piece at once and keeps the streams it opened, so a
// test can play the writer: report a stream's progress, or not.
type admittingTransport struct {
	mu      sync.Mutex
	streams map[transfer.Key]transfer.Stream
}

func (a *admittingTransport) AddPeer(string, transfer.Layout) error { return nil }
func (a *admittingTransport) RemovePeer(string)                     {}
func (a *admittingTransport) Open(st transfer.Stream) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.streams[st.Key] = st
	return nil
}
func (a *admittingTransport) Append(transfer.Key, transfer.Piece) error        { return nil }
func (a *admittingTransport) WaitAdmitted(context.Context, transfer.Key) error { return nil }
func (a *admittingTransport) Fence(transfer.Key) bool                          { return true }
func (a *admittingTransport) FenceWait(transfer.Key)                           {}
func (a *admittingTransport) Close() error                                     { return nil }
func (a *admittingTransport) Send(context.Context, transfer.SendRequest) error {
	return errors.New("admittingTransport: Send is not used by the owner")
}

func (a *admittingTransport) stream(room poll.RoomID) (transfer.Stream, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, st := range a.streams {
		if k.Room == uint64(room) {
			return st, true
		}
	}
	return transfer.Stream{}, false
}

// After its last Send a prefill room waits for its pages to move, which takes long behind
// other rooms or over a slow link. Its transfer-idle deadline must count the chunks the
// data plane writes, not only the scheduler's Sends: a room whose stream keeps moving for
// several idle timeouts stays Transferring, and one whose stream stops fails at the next
// (timeout:transferring).
func TestPrefillRoomWhoseStreamKeepsMovingIsNotIdle(t *testing.T) {
	tr := &admittingTransport{streams: map[transfer.Key]transfer.Stream{}}
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
