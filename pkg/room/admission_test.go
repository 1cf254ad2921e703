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

// fakeTransport is a transfer.Transport that takes every stream and keeps it, so a test
// can play the writer (report a stream's progress, or not). With admit set it admits a
// stream's last piece at once, inside Append, as a sender with room in its budget does;
// unset, it admits nothing until the test calls admitNow. Its WaitAdmitted panics: the
// owner answers a last Send from the admitted event, and no goroutine may wait inside the
// data plane.
type fakeTransport struct {
	admit   bool
	mu      sync.Mutex
	streams map[transfer.Key]transfer.Stream
	waiting chan transfer.Key // one send per last piece appended and not admitted
}

func newFakeTransport(admit bool) *fakeTransport {
	return &fakeTransport{admit: admit, streams: map[transfer.Key]transfer.Stream{}, waiting: make(chan transfer.Key, 16)}
}

func (f *fakeTransport) AddPeer(string, transfer.Layout) error { return nil }
func (f *fakeTransport) RemovePeer(string)                     {}
func (f *fakeTransport) Open(st transfer.Stream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.streams[st.Key] = st
	return nil
}
func (f *fakeTransport) Append(k transfer.Key, p transfer.Piece) error {
	if !p.Last {
		return nil
	}
	if !f.admit {
		f.waiting <- k
		return nil
	}
	f.admitNow(k)
	return nil
}

// admitNow reports the admission of k's stream, on the caller.
func (f *fakeTransport) admitNow(k transfer.Key) {
	f.mu.Lock()
	st := f.streams[k]
	f.mu.Unlock()
	if st.Admitted != nil {
		st.Admitted()
	}
}
func (f *fakeTransport) WaitAdmitted(context.Context, transfer.Key) error {
	panic("fakeTransport: WaitAdmitted called: a caller waits inside the data plane")
}
func (f *fakeTransport) Send(context.Context, transfer.SendRequest) error {
	return errors.New("fakeTransport: Send is not used by the owner")
}
func (f *fakeTransport) Fence(transfer.Key) bool { return true }
func (f *fakeTransport) FenceWait(transfer.Key)  {}
func (f *fakeTransport) Close() error            { return nil }

// stream is the stream opened for room.
func (f *fakeTransport) stream(room poll.RoomID) (transfer.Stream, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, st := range f.streams {
		if k.Room == uint64(room) {
			return st, true
		}
	}
	return transfer.Stream{}, false
}

// newHarnessOverTransport is a harness whose prefill runs its real data plane (PrefillData)
// over tr, with a region registered and decode advertising its layout.
func newHarnessOverTransport(t testing.TB, tr transfer.Transport) *harness {
	t.Helper()
	h, _ := newHarnessOverTransportOf(t, tr)
	return h
}

// newHarnessOverTransportOf is newHarnessOverTransport that also returns prefill's region.
func newHarnessOverTransportOf(t testing.TB, tr transfer.Transport) (*harness, region) {
	t.Helper()
	reg := newRegion(t)
	h := newHarnessWith(t, 1, options{
		pre: func(c *PrefillConfig) {
			c.DataPlane, c.RegionDirs = nil, tempRegionDirs()
			c.newTransport = func(transfer.RegionSet, transfer.SenderConfig) (transfer.Transport, error) { return tr, nil }
		},
		dec: func(c *DecodeConfig) { c.Layouts = []*pdlinkv1.RegionLayout{layoutPB(reg.layout)} },
	})
	if _, err := h.pre.RegisterRegion(reg.path, layoutPB(reg.layout)); err != nil {
		t.Fatal(err)
	}
	return h, reg
}

// docs/history/room-PLAN.md section 5: a last Send waiting for admission into the peer's
// in-flight budget is parked on its room in the owner, and answered at the
// latest when the room's Failed is visible, whatever the data plane does
// with the wait. Here the transport never admits and its fence wakes
// nobody; the room fails at its transfer-idle deadline (FakeClock), and the
// Send must come back Failed then, not at its own deadline.
func TestSendWaitingForAdmissionReturnsFailedWhenItsRoomFails(t *testing.T) {
	tr := newFakeTransport(false)
	h := newHarnessOverTransport(t, tr)
	const room = 7
	key := h.open(room, 1)
	if _, ok := h.until(tBound, func() bool { return h.preState(room) == poll.WaitingForInput }); !ok {
		t.Fatalf("prefill room %d is %v, want WaitingForInput", room, h.preState(room))
	}

	// The caller's own deadline is far beyond the test's bound: only the
	// owner can end this wait in time.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	answered := make(chan error, 1)
	go func() {
		answered <- h.pre.Send(ctx, &pdlinkv1.SendRequest{RoomId: room, Pages: &pdlinkv1.PageList{Indices: []int32{0, 1, 2}}, Last: true, AuxIndex: 1})
	}()
	select {
	case <-tr.waiting:
	case err := <-answered:
		t.Fatalf("the last Send returned %v before waiting for admission", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the last Send never waited for admission")
	}
	select {
	case err := <-answered:
		t.Fatalf("the last Send returned %v with its pages not admitted and its room going", err)
	default:
	}

	if _, ok := h.until(tBound, func() bool { return h.preState(room) == poll.Failed }); !ok {
		t.Fatalf("prefill room %d is %v, want Failed at its transfer-idle deadline", room, h.preState(room))
	}
	select {
	case err := <-answered:
		var ended *EndedError
		if !errors.As(err, &ended) || ended.Info.Key != key || ended.Info.Visible != poll.Failed {
			t.Fatalf("the last Send returned %v, want the room's Failed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the last Send still waits for admission after its room's Failed became visible")
	}
}

// admissionParked counts the last Sends parked on n's rooms for admission.
func admissionParked(n *PrefillOwner) int {
	k := 0
	n.withTable(func() {
		for _, list := range n.parked {
			for _, p := range list {
				if p.admission != nil && !p.done {
					k++
				}
			}
		}
	})
	return k
}

// Admission as an event: a last Send whose pages wait for the peer's budget is parked on
// its room in the owner, and the stream's admitted event, reported by a transfer goroutine,
// answers it OK; no goroutine waits inside the data plane (the fake's WaitAdmitted panics,
// as it did when the Send's gRPC goroutine sat in it). A retry after the event answers OK
// at once, and the room goes on transferring.
func TestLastSendAnswersFromTheAdmittedEvent(t *testing.T) {
	tr := newFakeTransport(false)
	h := newHarnessOverTransport(t, tr)
	const room = 9
	h.open(room, 1)
	if _, ok := h.until(tBound, func() bool { return h.preState(room) == poll.WaitingForInput }); !ok {
		t.Fatalf("prefill room %d is %v, want WaitingForInput", room, h.preState(room))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req := &pdlinkv1.SendRequest{RoomId: room, Pages: &pdlinkv1.PageList{Indices: []int32{0, 1, 2}}, Last: true, AuxIndex: 1}
	answered := make(chan error, 1)
	go func() { answered <- h.pre.Send(ctx, req) }()
	var tk transfer.Key
	select {
	case tk = <-tr.waiting:
	case err := <-answered:
		t.Fatalf("the last Send returned %v before its last piece was appended", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the last Send never appended its last piece")
	}
	if _, ok := h.until(tBound, func() bool { return admissionParked(h.pre) == 1 }); !ok {
		t.Fatalf("%d last Sends parked for admission, want 1", admissionParked(h.pre))
	}
	select {
	case err := <-answered:
		t.Fatalf("the last Send returned %v with its pages not admitted", err)
	default:
	}

	go tr.admitNow(tk) // a transfer goroutine reports the admission
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("the last Send returned %v after its admitted event, want OK", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the last Send still waits after its stream's admitted event")
	}
	if err := h.pre.Send(ctx, req); err != nil {
		t.Fatalf("a retry of the admitted last Send returned %v, want OK at once", err)
	}
	if n := admissionParked(h.pre); n != 0 {
		t.Fatalf("%d last Sends still parked for admission", n)
	}
	if s := h.preState(room); s != poll.Transferring {
		t.Fatalf("prefill room %d is %v after its last Send was admitted, want Transferring", room, s)
	}
}

// The data-plane callback queue is bounded by the rooms, not by the
// pieces that land: while the owner is busy, a room's progress events
// coalesce into the one already queued (counted), and the caller, a
// transfer goroutine, never waits. Its state still moves once the owner
// runs the one that was kept.
func TestProgressEventsOfARoomCoalesceWhileTheOwnerIsBusy(t *testing.T) {
	h := newHarness(t, 1)
	const room = 3
	key := h.open(room, 1)
	if _, ok := h.until(tBound, func() bool { return h.preState(room) == poll.WaitingForInput }); !ok {
		t.Fatalf("prefill room %d is %v, want WaitingForInput", room, h.preState(room))
	}
	_ = h.pre.FirstSend(room)
	if s := h.decState(room); s != poll.WaitingForInput {
		t.Fatalf("decode room %d is %v before any progress, want WaitingForInput", room, s)
	}

	release, busy := make(chan struct{}), make(chan struct{})
	go h.dec.exec(func() { close(busy); <-release })
	<-busy
	const pieces = 10000
	before := h.dec.ProgressDropped()
	start := time.Now()
	for range pieces {
		h.dec.OnProgress(key)
	}
	took := time.Since(start)
	h.dec.own.mu.Lock()
	queued := len(h.dec.own.queue)
	h.dec.own.mu.Unlock()
	close(release)
	if queued != 1 {
		t.Errorf("%d progress events of one room queued behind a busy owner, want 1", queued)
	}
	if d := h.dec.ProgressDropped() - before; d != pieces-1 {
		t.Errorf("%d progress events counted as coalesced, want %d", d, pieces-1)
	}
	if took > 5*time.Second {
		t.Errorf("%d progress events took %v with the owner busy: the callbacks waited", pieces, took)
	}
	h.settle()
	if s := h.decState(room); s != poll.Transferring {
		t.Fatalf("decode room %d is %v after its progress ran, want Transferring", room, s)
	}
}

// A transfer goroutine that reports a failure (OnFailed, on either side)
// or prefill's progress never waits for the owner: the owner may be busy,
// or asking that data plane to fence. The failure is stepped once the
// owner runs it.
func TestDataPlaneCallbacksReturnWhileTheOwnerIsBusy(t *testing.T) {
	h := newHarness(t, 1)
	const room = 5
	h.open(room, 1)
	if _, ok := h.until(tBound, func() bool { return h.preState(room) == poll.WaitingForInput }); !ok {
		t.Fatalf("prefill room %d is %v, want WaitingForInput", room, h.preState(room))
	}
	info, err := h.pre.Get(room)
	if err != nil {
		t.Fatal(err)
	}
	for _, side := range []struct {
		name   string
		core   *core
		failed func()
	}{
		{"prefill progress", h.pre.core, func() { h.pre.OnProgress(info.Key) }},
		{"prefill", h.pre.core, func() { h.pre.OnFailed(info.Key, poll.ReasonTransferError) }},
		{"decode", h.dec.core, func() { h.dec.OnFailed(info.Key, poll.ReasonChecksum) }},
	} {
		release, busy := make(chan struct{}), make(chan struct{})
		go side.core.exec(func() { close(busy); <-release })
		<-busy
		returned := make(chan struct{})
		go func() { side.failed(); close(returned) }()
		select {
		case <-returned:
		case <-time.After(5 * time.Second):
			t.Errorf("%s callback waited for a busy owner", side.name)
		}
		close(release)
		<-returned
	}
	h.settle()
	if s := h.preState(room); s != poll.Failed {
		t.Fatalf("prefill room %d is %v after OnFailed ran, want Failed", room, s)
	}
	if r, _ := h.reason(h.pre, room); r != poll.ReasonTransferError {
		t.Fatalf("prefill room %d failed with %v, want %v", room, r, poll.ReasonTransferError)
	}
}
