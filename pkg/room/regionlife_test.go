package room

import (
	"context"
	"net"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/rankmap"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// midCopyTransport is a fakeTransport whose worker is mid-copy of a room's
// source pages: it takes a slice of the region at the room's first Append,
// as the real sender's writer plans its chunks, and its Fence is not done
// until the test lets that copy finish (finishCopy), as with a writer a
// FenceGrace deadline cannot interrupt (a copy out of memory, not a read).
type midCopyTransport struct {
	*fakeTransport
	region     *transfer.Region
	onFenced   func(transfer.Key)
	mu         sync.Mutex
	held       []byte
	fenceAsked chan transfer.Key
}

func (h *midCopyTransport) Append(k transfer.Key, p transfer.Piece) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held == nil && len(p.Src) > 0 && len(p.Src[0]) > 0 {
		h.held = h.region.Pages(0, p.Src[0][0])
	}
	return nil
}

func (h *midCopyTransport) Fence(k transfer.Key) bool {
	h.fenceAsked <- k
	return false
}

// finishCopy reads every byte the worker holds (a fault, killing the test
// binary, if the mapping was unmapped under it), then reports the fence
// done as the real worker would.
func (h *midCopyTransport) finishCopy(k transfer.Key) int {
	h.mu.Lock()
	sum := 0
	for _, b := range h.held {
		sum += int(b)
	}
	h.mu.Unlock()
	h.onFenced(k)
	return sum
}

// UnregisterRegion while a worker still copies a room's source pages: the
// room fails with region_replaced and is fenced first, and the mapping is
// unmapped only once that fence is done, so the worker's copy finishes on
// mapped memory and the daemon does not crash. Unmapping at once (before
// the fences are done) faults in finishCopy.
func TestUnregisterRegionUnmapsOnlyAfterAWriterMidCopyLetGo(t *testing.T) {
	reg := newRegion(t)
	tr := &midCopyTransport{fakeTransport: newFakeTransport(true), fenceAsked: make(chan transfer.Key, 4)}
	h := newHarnessWith(t, 1, options{
		pre: func(c *PrefillConfig) {
			c.DataPlane, c.RegionDirs = nil, tempRegionDirs()
			c.newTransport = func(r transfer.RegionSet, cfg transfer.SenderConfig) (transfer.Transport, error) {
				tr.region, tr.onFenced = r.ForRank(transfer.Rank{Size: 1}), cfg.OnFenced
				return tr, nil
			}
		},
		dec: func(c *DecodeConfig) { c.Layouts = []*pdlinkv1.RegionLayout{layoutPB(reg.layout)} },
	})
	if _, err := h.pre.RegisterRegion(reg.path, layoutPB(reg.layout)); err != nil {
		t.Fatal(err)
	}
	const room = 7
	h.openAndSendFirstPages(room)

	un := unregisterPastAHeldWriter(t, func() (Unregistered, error) { return h.pre.UnregisterRegion(nil) },
		tr.fenceAsked, func() poll.State { return h.preState(room) }, func(k transfer.Key) { tr.finishCopy(k) })
	if !un.Dropped || un.RoomsFailed != 1 {
		t.Fatalf("UnregisterRegion: %+v, want the region dropped and 1 room failed", un)
	}
	if !h.waitReal(10*time.Second, func() bool { return h.preState(room) == poll.Failed }) {
		t.Fatalf("room %d is %v after its fence, want Failed", room, h.preState(room))
	}
	if r, _ := h.reason(h.pre, room); r != poll.ReasonRegionReplaced {
		t.Fatalf("room %d failed with %q, want region_replaced", room, r)
	}
	if h.pre.Region() != (transfer.RegionID{}) {
		t.Fatal("a region is still registered after UnregisterRegion")
	}
}

// A decode region registered again with another layout reaches the
// prefill daemons in REGISTER (the link sends it again, also when a
// REGISTER is still on its way); the same layout in a new file does not.
func TestNewRegionLayoutReachesThePrefillInRegister(t *testing.T) {
	small, big := newRegion(t), newRegion(t)
	big.layout = transfer.UniformLayout(4, 32, 4096, 8, 64) // fewer pages: a compatible layout, another shape
	var mu sync.Mutex
	current := layoutPB(small.layout)
	h := newHarnessWith(t, 1, options{dec: func(c *DecodeConfig) {
		c.LayoutsFunc = func() []*pdlinkv1.RegionLayout {
			mu.Lock()
			defer mu.Unlock()
			return []*pdlinkv1.RegionLayout{current}
		}
	}})
	peerLayoutPages := func() int64 {
		peers := h.pre.Peers()
		if len(peers) != 1 || len(peers[0].Layouts) != 1 {
			return -1
		}
		return int64(peers[0].Layouts[0].Buffers[0].Length / uint64(peers[0].Layouts[0].Buffers[0].ItemLen))
	}
	h.open(1, 1)
	if _, ok := h.until(tBound, func() bool { return peerLayoutPages() == 64 }); !ok {
		t.Fatalf("prefill has %d pages for the decode layout, want 64", peerLayoutPages())
	}
	mu.Lock()
	current = layoutPB(big.layout)
	mu.Unlock()
	h.dec.link.RegisterAgain()
	if _, ok := h.until(tBound, func() bool { return peerLayoutPages() == 32 }); !ok {
		t.Fatalf("prefill has %d pages for the decode layout after RegisterAgain, want 32", peerLayoutPages())
	}
}

// The slot tells the peers (onLayout) when a registration changes the
// layout or follows an unregister, and not when the same layout comes in
// a new file or the rank is unregistered.
func TestRegionSlotAnnouncesOnlyAChangedLayout(t *testing.T) {
	a, b := newRegion(t), newRegion(t)
	other := transfer.UniformLayout(4, 32, 4096, 8, 64)
	announced := 0
	s := &regionSlot{log: zap.NewNop(), onLayout: func() { announced++ }}
	allowTempRegions(t, s)
	for _, step := range []struct {
		path   string
		layout transfer.Layout
		unreg  bool
		want   int
		gen    uint64
	}{
		{a.path, a.layout, false, 0, 1}, // the first: the link registers on its own
		{a.path, a.layout, false, 0, 1}, // idempotent
		{b.path, b.layout, false, 0, 2}, // another file, same layout
		{a.path, other, false, 1, 3},    // another path and layout
		{"", transfer.Layout{}, true, 1, 3},
		{a.path, other, false, 2, 4}, // after an unregister: a peer may have registered us meanwhile
		{b.path, b.layout, false, 3, 5},
	} {
		if step.unreg {
			if un, err := s.unregister(nil); err != nil || !un.Dropped {
				t.Fatalf("unregister: %+v %v", un, err)
			}
		} else {
			reg, err := s.register(step.path, layoutPB(step.layout))
			if err != nil {
				t.Fatal(err)
			}
			if reg.File.Generation != step.gen {
				t.Fatalf("register %s: generation %d, want %d", step.path, reg.File.Generation, step.gen)
			}
		}
		if announced != step.want {
			t.Fatalf("after %+v: announced %d times, want %d", step, announced, step.want)
		}
	}
	s.close()
}

// midWriteSink is a transfer.Sink whose connection goroutine is mid-write
// into a room's destination pages: it takes a slice of the region at the
// room's Expect, and its Fence is not done until the test lets the write
// finish (finishWrite).
type midWriteSink struct {
	region     *transfer.Region
	onFenced   func(transfer.Key)
	mu         sync.Mutex
	held       []byte
	fenceAsked chan transfer.Key
}

func (s *midWriteSink) Expect(e transfer.Expectation) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held == nil && len(e.Dst) > 0 && len(e.Dst[0]) > 0 {
		s.held = s.region.Pages(0, e.Dst[0][0])
	}
	return nil
}

func (s *midWriteSink) Fence(k transfer.Key) bool {
	select {
	case s.fenceAsked <- k:
	default: // a later Fence of the same room (Forget)
	}
	return false
}

func (s *midWriteSink) FenceWait(transfer.Key) {}
func (s *midWriteSink) ServeConn(c net.Conn)   { c.Close() }
func (s *midWriteSink) Close() error           { return nil }

// finishWrite writes every byte the goroutine holds (a fault, killing the
// test binary, if the mapping was unmapped under it), then reports the
// fence done.
func (s *midWriteSink) finishWrite(k transfer.Key) {
	s.mu.Lock()
	for i := range s.held {
		s.held[i] = 0xab
	}
	s.mu.Unlock()
	s.onFenced(k)
}

// The decode side of the test above: UnregisterRegion while a write into
// a room's pages is still landing fails the room with region_replaced
// (prefill sees aborted:remote naming it), fences it, and unmaps the
// region only once the write let go.
func TestDecodeUnregisterRegionUnmapsOnlyAfterAWriteMidCopyLetGo(t *testing.T) {
	reg := newRegion(t)
	sink := &midWriteSink{fenceAsked: make(chan transfer.Key, 1)}
	h := newHarnessWith(t, 1, options{dec: func(c *DecodeConfig) {
		c.DataPlane, c.RegionDirs = nil, tempRegionDirs()
		c.newSink = func(r transfer.RegionSet, cfg transfer.ReceiverConfig, _ transfer.Events) (transfer.Sink, error) {
			sink.region, sink.onFenced = r.ForRank(transfer.Rank{Size: 1}), cfg.OnFenced
			return sink, nil
		}
	}})
	if _, err := h.dec.RegisterRegion(reg.path, layoutPB(reg.layout)); err != nil {
		t.Fatal(err)
	}
	const room = 7
	if _, err := h.pre.Open(room, 0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := h.dec.Open(room, prefillAddr, 1); err != nil {
		t.Fatal(err)
	}
	md := &pdlinkv1.SendMetadataRequest{RoomId: room, DstPages: &pdlinkv1.PageList{Indices: []int32{1, 2, 3}}, AuxIndex: 4}
	if err := h.dec.SubmitMetadata(context.Background(), md); err != nil {
		t.Fatal(err)
	}
	if _, ok := h.until(tBound, func() bool { return h.preState(room) == poll.WaitingForInput }); !ok {
		t.Fatalf("prefill room %d is %v, want WaitingForInput", room, h.preState(room))
	}

	un := unregisterPastAHeldWriter(t, func() (Unregistered, error) { return h.dec.UnregisterRegion(&pdlinkv1.Rank{TpRank: 0, TpSize: 1}) },
		sink.fenceAsked, func() poll.State { return h.decState(room) }, sink.finishWrite)
	if !un.Dropped || un.RoomsFailed != 1 {
		t.Fatalf("UnregisterRegion: %+v, want the region dropped and 1 room failed", un)
	}
	if _, ok := h.until(tBound, func() bool { return h.decState(room) == poll.Failed && h.preState(room) == poll.Failed }); !ok {
		t.Fatalf("room %d: decode %v, prefill %v after the fence, want both Failed", room, h.decState(room), h.preState(room))
	}
	if r, _ := h.reason(h.dec, room); r != poll.ReasonRegionReplaced {
		t.Fatalf("decode room %d failed with %q, want region_replaced", room, r)
	}
	if r, peer := h.reason(h.pre, room); r != poll.ReasonAbortedRemote || peer != poll.ReasonRegionReplaced {
		t.Fatalf("prefill room %d failed with %q (peer %q), want aborted:remote naming region_replaced", room, r, peer)
	}
}

// Re-registering the same file with a layout that now describes its heads
// (an engine upgraded in place) is a new generation that the peers learn,
// not an idempotent repeat that keeps the old opaque layout.
func TestReRegisteringTheSameFileWithADescribedLayoutIsANewGeneration(t *testing.T) {
	a := newRegion(t)
	described := a.layout
	described.Attention = rankmap.MHA
	described.Buffers = slices.Clone(a.layout.Buffers)
	for i := range described.Buffers {
		// 4096-byte pages: 16 tokens of 2 heads of 128 bytes.
		described.Buffers[i].PageTokens, described.Buffers[i].TotalHeads, described.Buffers[i].RankHeads, described.Buffers[i].HeadBytes = 16, 2, 2, 128
	}
	if err := described.Validate(); err != nil {
		t.Fatal(err)
	}
	announced := 0
	s := &regionSlot{log: zap.NewNop(), onLayout: func() { announced++ }}
	allowTempRegions(t, s)
	if reg, err := s.register(a.path, layoutPB(a.layout)); err != nil || reg.File.Generation != 1 {
		t.Fatalf("first register: %+v %v", reg, err)
	}
	reg, err := s.register(a.path, layoutPB(described))
	if err != nil {
		t.Fatal(err)
	}
	if reg.File.Generation != 2 || announced != 1 {
		t.Fatalf("same file, described layout: generation %d, announced %d; want 2 and 1", reg.File.Generation, announced)
	}
	if got := s.get().Layout(); !got.Equal(described) {
		t.Fatalf("the slot serves %+v, want the described layout", got)
	}
}

// Registering the same file again, whole, with the same layout, renews its
// mapping (transfer.Mapping.Renew: the same-host connections offer it to
// decode again) and keeps its generation; one cut below its layout is
// refused and renews nothing; put back to its size it is the same file and
// generation, renewed again (#26 item 1: a truncated file restored and
// registered again used to be answered idempotent and nothing else, so what
// decode found while it was short stayed for the connection's life).
func TestRegisteringTheSameFileAgainRenewsItsMapping(t *testing.T) {
	a := newRegion(t)
	s := &regionSlot{log: zap.NewNop()}
	allowTempRegions(t, s)
	first, err := s.register(a.path, layoutPB(a.layout))
	if err != nil {
		t.Fatal(err)
	}
	m := s.get().Current()
	for i, step := range []struct {
		size     int64
		refused  bool
		renewals uint64
	}{
		{a.layout.Size(), false, 1},
		{a.layout.Aux.Offset, true, 1}, // cut at its aux rows
		{a.layout.Size(), false, 2},    // put back: the same inode
	} {
		if err := os.Truncate(a.path, step.size); err != nil {
			t.Fatal(err)
		}
		reg, err := s.register(a.path, layoutPB(a.layout))
		if step.refused != (err != nil) {
			t.Fatalf("step %d: register of a %d-byte file: %+v %v, refused %v", i, step.size, reg, err, step.refused)
		}
		if cur := s.get().Current(); cur != m || m.Renewals() != step.renewals {
			t.Fatalf("step %d: mapping replaced %v, renewals %d; want the same mapping renewed %d times", i, cur != m, m.Renewals(), step.renewals)
		}
		if err == nil && reg.File != first.File {
			t.Fatalf("step %d: the same file registered again answered %+v, want %+v", i, reg.File, first.File)
		}
	}
	s.close()
}

// unregisterPastAHeldWriter runs unregister while the data plane holds a
// room's copy (I9): it must fence the room, not answer and not show the
// room Failed while the copy goes on, and answer once finish lets the
// copy end.
func unregisterPastAHeldWriter(t *testing.T, unregister func() (Unregistered, error), fenceAsked <-chan transfer.Key, state func() poll.State, finish func(transfer.Key)) Unregistered {
	t.Helper()
	answered := make(chan Unregistered, 1)
	go func() {
		un, err := unregister()
		if err != nil {
			t.Error(err)
		}
		answered <- un
	}()
	var key transfer.Key
	select {
	case key = <-fenceAsked:
	case <-time.After(10 * time.Second):
		t.Fatal("UnregisterRegion never fenced the room in flight")
	}
	select {
	case un := <-answered:
		t.Fatalf("UnregisterRegion answered %+v while the region's memory was still being copied", un)
	default:
	}
	if state() == poll.Failed {
		t.Fatal("the room's Failed is visible while its copy is still in progress (I9)")
	}
	finish(key)
	select {
	case un := <-answered:
		return un
	case <-time.After(10 * time.Second):
		t.Fatal("UnregisterRegion did not answer once the fence was done")
	}
	return Unregistered{}
}

// Decode's same-host stat saw the prefill file replaced before prefill's
// engine registered the new one (the RESULT's region_replaced, played here
// by the stream's Done): prefill fails the room region_replaced, decode's
// room ends aborted:remote naming it (as when prefill notices itself), and
// the register of the new file counts that room in rooms_failed and the
// file once in RegionReplaced. Without the early count the register said
// 0 rooms; counting the file at the notice and again at the register said
// 2 files.
func TestReplacedFileSeenByDecodeCountsInTheRegister(t *testing.T) {
	tr := newFakeTransport(true)
	h, reg := newHarnessOverTransportOf(t, tr)
	const room = 7
	h.openAndSendFirstPages(room)
	st, ok := tr.stream(room)
	if !ok || st.Done == nil {
		t.Fatal("the room's stream was not opened")
	}
	next := recreateRegionFile(t, reg)
	st.Done(&transfer.Error{Reason: transfer.ReasonRegionReplaced, Err: transfer.ErrRegionReplaced})
	if !h.waitReal(10*time.Second, func() bool { return h.preState(room) == poll.Failed && h.decState(room) == poll.Failed }) {
		t.Fatalf("room %d: prefill %v, decode %v, want both Failed", room, h.preState(room), h.decState(room))
	}
	if r, _ := h.reason(h.pre, room); r != poll.ReasonRegionReplaced {
		t.Fatalf("prefill room failed %q, want region_replaced", r)
	}
	if r, peer := h.reason(h.dec, room); r != poll.ReasonAbortedRemote || peer != poll.ReasonRegionReplaced {
		t.Fatalf("decode room failed %q (peer %q), want aborted:remote naming region_replaced", r, peer)
	}
	got, err := h.pre.RegisterRegion(next, layoutPB(reg.layout))
	if err != nil {
		t.Fatal(err)
	}
	if got.File.Generation != 2 || got.RoomsFailed != 1 {
		t.Errorf("register of the new file: generation %d, rooms_failed %d; want 2 and 1 (the room decode saw)", got.File.Generation, got.RoomsFailed)
	}
	if n := h.pre.RegionReplaced(); n != 1 {
		t.Errorf("RegionReplaced %d, want 1: one file, one generation", n)
	}
	if n := h.pre.RegionReplacedRooms(); n != 1 {
		t.Errorf("RegionReplacedRooms %d, want 1", n)
	}
}

// recreateRegionFile replaces r's file at its path with a new one of the
// same size (a new inode), as a restarting engine does, and returns the path.
func recreateRegionFile(t *testing.T, r region) string {
	t.Helper()
	tmp := r.path + ".next"
	if err := os.WriteFile(tmp, make([]byte, r.layout.Size()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, r.path); err != nil {
		t.Fatal(err)
	}
	return r.path
}

// openAndSendFirstPages opens room on both sides, waits until prefill has
// it bound (WaitingForInput) and sends its first two pages, not the last.
func (h *harness) openAndSendFirstPages(room poll.RoomID) {
	h.t.Helper()
	h.open(room, 1)
	if _, ok := h.until(tBound, func() bool { return h.preState(room) == poll.WaitingForInput }); !ok {
		h.t.Fatalf("prefill room %d is %v, want WaitingForInput", room, h.preState(room))
	}
	if err := h.pre.Send(context.Background(), &pdlinkv1.SendRequest{RoomId: uint64(room), Pages: &pdlinkv1.PageList{Indices: []int32{0, 1}}}); err != nil {
		h.t.Fatal(err)
	}
}
