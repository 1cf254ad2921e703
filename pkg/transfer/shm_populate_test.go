package transfer

import (
	"bytes"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// holdPopulate makes r's populate worker report each step's mapping on calls and hold in
// its first step until letGo (called at the test's end at the latest: Close waits for it).
// exited is set once that first step returned.
func holdPopulate(t *testing.T, r *Receiver) (calls chan *Mapping, letGo func(), exited *atomic.Bool) {
	t.Helper()
	calls, exited = make(chan *Mapping, 64), &atomic.Bool{}
	release := make(chan struct{})
	var first sync.Once
	r.pmu.Lock()
	r.populate = func(m *Mapping, off, n int64) error {
		calls <- m
		first.Do(func() {
			<-release
			exited.Store(true)
		})
		return nil
	}
	r.pmu.Unlock()
	return calls, releaseOnCleanup(t, release), exited
}

func nextPopulate(t *testing.T, calls chan *Mapping, what string) *Mapping {
	t.Helper()
	select {
	case m := <-calls:
		return m
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no pre-fault step within 10s", what)
		return nil
	}
}

func isTracked(m *Mapping) bool {
	mapped.Lock()
	defer mapped.Unlock()
	_, ok := mapped.m[m]
	return ok
}

// TestShmOfferAnsweredWhileItsMappingIsPrefaulted: decode answers an offer once the file
// is proven and mapped, not once its pages are pre-faulted, and pre-faults off the
// connection goroutine. While the populate worker is held in its first step on rank 0's
// mapping, rank 0's room completes by shm (a chunk that arrives before the pre-fault is
// done copies from the proven mapping and faults its source pages in on first touch: it
// neither waits nor falls back to TCP), and rank 1's offer on the same connection is
// answered and its room completes too; rank 1's mapping is pre-faulted once the worker
// goes on.
func TestShmOfferAnsweredWhileItsMappingIsPrefaulted(t *testing.T) {
	l := faultLayout()
	g := shmRig(t, l, KindAuto, KindAuto, SenderConfig{ConnsPerPeer: 1}, ReceiverConfig{})
	calls, letGo, _ := holdPopulate(t, g.rcv)
	all := SamePages(2, []Run{{0, 64}})
	k0 := Key{Room: 1, Nonce: 1, Rank: Rank{TP: 0, Size: 2}}
	done0 := g.expectSend(t, k0, all, all, nil, -1)
	first := nextPopulate(t, calls, "rank 0's offer")
	if first.ID().Path != g.src.Path() {
		t.Fatalf("pre-faulting %s, want the offered %s", first.ID().Path, g.src.Path())
	}
	if err := waitDone(t, done0); err != nil {
		t.Fatalf("rank 0's room while its mapping is pre-faulted: %v", err)
	}
	k1 := Key{Room: 1, Nonce: 1, Rank: Rank{TP: 1, Size: 2}}
	if err := waitDone(t, g.expectSend(t, k1, all, all, nil, -1)); err != nil {
		t.Fatalf("rank 1's room while rank 0's mapping is pre-faulted: %v", err)
	}
	for _, k := range []Key{k0, k1} {
		if r := g.ev.wait(t, k); r != "" {
			t.Fatalf("%v: receiver outcome %q", k, r)
		}
	}
	equalPages(t, g, all, all)
	rs := g.rcv.ShmStats()
	if want := uint64(2 * 128 * (64 << 10)); rs.Accepted != 2 || rs.CopiedBytes != want {
		t.Fatalf("%d offers accepted, %d bytes copied by shm; want 2 and %d", rs.Accepted, rs.CopiedBytes, want)
	}
	if first.closed.Load() {
		t.Fatal("rank 0's mapping was unmapped while the worker pre-faulted it")
	}
	letGo()
	if m := nextPopulate(t, calls, "rank 1's offer, queued"); m == first {
		t.Fatal("rank 0's mapping pre-faulted twice, rank 1's not at all")
	}
	g.rcv.Fence(k0)
	g.rcv.Fence(k1)
}

// TestShmRetiredOfferIsUnmappedOnlyAfterItsPrefaultStep: a new generation's offer retires
// the old offer's mapping while the worker is in a pre-fault step on it. The connection
// goroutine does not wait for the step (the new generation's room completes meanwhile)
// and does not unmap under it: the old mapping stays mapped until the step returns, then
// the worker unmaps it before it moves on to the new one.
func TestShmRetiredOfferIsUnmappedOnlyAfterItsPrefaultStep(t *testing.T) {
	l := faultLayout()
	g := shmRig(t, l, KindAuto, KindAuto, SenderConfig{ConnsPerPeer: 1}, ReceiverConfig{})
	calls, letGo, _ := holdPopulate(t, g.rcv)
	all := SamePages(2, []Run{{0, 64}})
	k1 := Key{Room: 1, Nonce: 1}
	done1 := g.expectSend(t, k1, all, all, nil, -1)
	old := nextPopulate(t, calls, "generation 1's offer")
	if err := waitDone(t, done1); err != nil {
		t.Fatal(err)
	}
	g.rcv.Fence(k1)

	path, err := CreateRegionFile(filepath.Dir(g.src.Path()), l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
	next, err := OpenMapping(path, l)
	if err != nil {
		t.Fatal(err)
	}
	gen1 := g.src.Replace(next, 2)
	t.Cleanup(func() { gen1.Close() })
	for b := range 2 {
		fill(g.src.Buffer(b), uint64(b+40))
	}
	k2 := Key{Room: 2, Nonce: 1}
	if err := waitDone(t, g.expectSend(t, k2, all, all, nil, -1)); err != nil {
		t.Fatalf("generation 2's room while generation 1's mapping is pre-faulted: %v", err)
	}
	equalPages(t, g, all, all)
	if old.closed.Load() || !isTracked(old) {
		t.Fatal("the retired mapping was unmapped while a pre-fault step ran on it")
	}
	letGo()
	if m := nextPopulate(t, calls, "generation 2's offer"); m.ID().Path != path {
		t.Fatalf("pre-faulting %s, want generation 2's %s", m.ID().Path, path)
	}
	if !old.closed.Load() || isTracked(old) {
		t.Fatal("the retired mapping is still mapped after its pre-fault step ended")
	}
	g.rcv.Fence(k2)
}

// TestReceiverCloseWaitsForThePrefaultStep: Close returns only once the populate worker's
// step ended and it exited; the connection's mapping, dropped while the step ran, is
// unmapped by then and no later step starts.
func TestReceiverCloseWaitsForThePrefaultStep(t *testing.T) {
	l := faultLayout()
	g := shmRig(t, l, KindAuto, KindAuto, SenderConfig{ConnsPerPeer: 1}, ReceiverConfig{})
	g.rcv.pmu.Lock()
	g.rcv.pop.step = 1 << 20 // several steps to the region
	g.rcv.pmu.Unlock()
	calls, letGo, exited := holdPopulate(t, g.rcv)
	all := SamePages(2, []Run{{0, 64}})
	k := Key{Room: 1, Nonce: 1}
	if err := waitDone(t, g.expectSend(t, k, all, all, nil, -1)); err != nil {
		t.Fatal(err)
	}
	m := nextPopulate(t, calls, "the offer")
	closed := make(chan struct{})
	go func() { g.rcv.Close(); close(closed) }()
	// The connection ended and dropped its mapping.
	until(t, 10*time.Second, "connection ended after Close", func() bool { return g.rcv.ShmStats().ShmConns == 0 })
	select {
	case <-closed:
		t.Fatal("Close returned while a pre-fault step ran")
	default:
	}
	letGo()
	waitClosed(t, closed, "Close after the step")
	if !exited.Load() || !m.closed.Load() || isTracked(m) {
		t.Fatalf("after Close: step exited %v, mapping unmapped %v", exited.Load(), m.closed.Load())
	}
	if len(calls) != 0 {
		t.Fatalf("%d pre-fault steps after the connection dropped its mapping", len(calls))
	}
}

// TestShmPrefaultOfATruncatedSourceIsAnErrorNotAFault: MADV_POPULATE_READ over a source
// whose file was truncated reports EFAULT instead of raising SIGBUS, so the worker needs no
// fault handling of its own (a chunk's stat or touchRegion fails the room, as before).
func TestShmPrefaultOfATruncatedSourceIsAnErrorNotAFault(t *testing.T) {
	l := faultLayout()
	src := openTestRegion(t, l)
	m, code, err := openShmSource(NewShmOffer(src.Current()))
	if code != ShmAccepted {
		t.Fatalf("offer refused: %v %v", code, err)
	}
	defer m.Close()
	size := int64(len(m.mem))
	if err := populateRange(m, 0, size); errors.Is(err, unix.EINVAL) {
		t.Skipf("no MADV_POPULATE_READ on this kernel: %v", err)
	} else if err != nil {
		t.Fatalf("pre-fault of a whole source: %v", err)
	}
	if err := os.Truncate(src.Path(), 0); err != nil {
		t.Fatal(err)
	}
	if err := populateRange(m, 0, size); !errors.Is(err, unix.EFAULT) {
		t.Fatalf("pre-fault of a truncated source: %v, want EFAULT", err)
	}
}

// TestShmChunkNamingAnOfferNotProvenFailsTheRoomInvalid: a chunk never copies from a file
// whose identity decode did not prove. A shm chunk naming an offer id decode never
// answered fails its room invalid before a byte lands (COPIED, then RESULT invalid) and
// the connection goes on; the offer is proven on the connection goroutine, before its
// answer and before any later frame is read, so an honest sender, which waits for the
// answer, never sends one.
func TestShmChunkNamingAnOfferNotProvenFailsTheRoomInvalid(t *testing.T) {
	l := UniformLayout(1, 4, 4096, 0, 0)
	rcv, dst, ev, addr := rawReceiver(t, l, ReceiverConfig{Transport: KindAuto})
	memset(dst.Buffer(0), 0xAA)
	k := Key{Room: 5, Nonce: 9}
	if err := rcv.Expect(Expectation{Key: k, Dst: [][]Run{{{0, 1}}}, AuxRow: -1}); err != nil {
		t.Fatal(err)
	}
	runs := AppendShmRuns(nil, []ShmRun{{ChunkRun: ChunkRun{Buffer: 0, Run: Run{Start: 0, Count: 1}}, Offer: 1}})
	frame := make([]byte, HeaderSize, HeaderSize+len(runs))
	(&Header{Type: FrameChunk, Flags: FlagPayloadCRC | FlagShm, Room: k.Room, Nonce: k.Nonce, NumRuns: 1, Pages: 1,
		PayloadCRC: crc32.Checksum(make([]byte, 4096), castagnoli), RunsCRC: RunsChecksum(runs)}).Encode(frame)
	c := dialRaw(t, addr)
	c.write(append(frame, runs...))
	if res := c.sync(); res[k] != uint32(ReasonInvalid.code()) {
		t.Fatalf("results %v, want %v invalid", res, k)
	}
	if r := ev.wait(t, k); r != ReasonInvalid {
		t.Fatalf("room outcome %q, want invalid", r)
	}
	if !bytes.Equal(dst.Buffer(0), bytes.Repeat([]byte{0xAA}, len(dst.Buffer(0)))) {
		t.Fatal("a chunk of an unproven offer wrote destination pages")
	}
	c.sync() // the connection still serves
}
