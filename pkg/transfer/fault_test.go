//go:build linux

package transfer

import (
	"bytes"
	"context"
	"errors"
	"os"
	"runtime/debug"
	"sync"
	"testing"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// The tests in this file pin that a region file truncated while its pages are being copied
// fails the rooms being copied with transfer_error and leaves the daemon serving: without
// touchRegion the first access past the new end raises SIGBUS and kills the test binary.

// holdFirst returns a hook that blocks its first call until release is closed, after closing
// held, and lets every later call through.
func holdFirst() (hook func(), held, release chan struct{}) {
	held, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	return func() {
		once.Do(func() {
			close(held)
			<-release
		})
	}, held, release
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10s", what)
	}
}

// faultLayout is a room large enough to take several chunks (8 MiB over 2 buffers).
func faultLayout() Layout { return UniformLayout(2, 64, 64<<10, 4, 64) }

// TestSourceTruncatedMidChecksumFailsRoomNotDaemon: prefill's region file is truncated to 0
// while a large room's first chunk is about to be checksummed. The room fails with
// transfer_error (the connection breaks, as a broken write does), the fault is
// counted once, and once the file has its size again the same Sender sends a second room
// whose bytes all arrive. Without checksums the first access is the chunk's write, which the
// kernel fails with EFAULT (over TCP; on a MemNetwork the receiver's goroutine would do that
// copy, see the decode test).
func TestSourceTruncatedMidChecksumFailsRoomNotDaemon(t *testing.T) {
	for _, tc := range []struct {
		name     string
		tcp      bool
		checksum Checksum
	}{{"mem", false, ChecksumCRC32C}, {"tcp", true, ChecksumCRC32C}, {"tcp-no-checksum", true, ChecksumNone}} {
		t.Run(tc.name, func(t *testing.T) {
			l := faultLayout()
			g := newRig(t, l, l, tc.tcp, SenderConfig{Checksum: tc.checksum, MaxChunkBytes: 1 << 20, RedialMin: time.Millisecond},
				ReceiverConfig{Checksum: tc.checksum})
			hook, held, release := holdFirst()
			g.snd.beforeTouch = hook
			all := SamePages(2, []Run{{0, 64}})
			aux := bytes.Repeat([]byte{5}, 64)

			k1 := Key{Room: 1, Nonce: 1}
			if err := g.rcv.Expect(Expectation{Key: k1, Dst: all, AuxRow: 0}); err != nil {
				t.Fatal(err)
			}
			done := g.send(t, k1, all, all, aux)
			waitClosed(t, held, "checksum pass over the first chunk")
			if err := os.Truncate(g.src.Path(), 0); err != nil {
				t.Fatal(err)
			}
			close(release)
			err := waitDone(t, done)
			if ReasonOf(err) != ReasonTransferError || !errors.Is(err, ErrRegionFault) {
				t.Fatalf("room on a truncated source: %v; want transfer_error from a region fault", err)
			}
			// Nothing of the room was written before the fault, so the receiver only
			// learns of it from the control plane (prefill reports it Failed): it must
			// just never be Complete.
			if r, ok := g.ev.get(k1); ok && r == "" {
				t.Fatal("receiver reported the room complete")
			}
			if n := g.src.Faults(); n != 1 {
				t.Fatalf("source region faults %d, want 1", n)
			}
			g.rcv.Fence(k1)

			if err := os.Truncate(g.src.Path(), l.Size()); err != nil {
				t.Fatal(err)
			}
			for b := range 2 {
				fill(g.src.Buffer(b), uint64(b+10))
			}
			k2 := Key{Room: 2, Nonce: 1}
			if err := g.rcv.Expect(Expectation{Key: k2, Dst: all, AuxRow: 1}); err != nil {
				t.Fatal(err)
			}
			if err := waitDone(t, g.send(t, k2, all, all, aux)); err != nil {
				t.Fatalf("second room: %v", err)
			}
			if r := g.ev.wait(t, k2); r != "" {
				t.Fatalf("second room: receiver outcome %q", r)
			}
			for b := range 2 {
				if !bytes.Equal(g.dst.Buffer(b), g.src.Buffer(b)) {
					t.Fatalf("second room: buffer %d differs", b)
				}
			}
			g.rcv.Fence(k2)
		})
	}
}

// TestDestinationTruncatedMidChunkFailsRoomReceiverServes: decode's region file is truncated
// under one room's pages while its first piece is about to land, with a second room queued
// behind it on the same connection. Only the first room fails (transfer_error, on both
// sides); the second lands whole on that connection (one dial: it was not dropped), the fault
// is counted, and once the file has its size again the same Receiver takes a third room
// into the pages that faulted. Over TCP only: on a MemNetwork the copy into the destination
// happens inside net.Pipe's Read, and a pipe whose reader faulted mid-copy leaves its writer
// waiting for the count forever (net.Pipe's limit, not the receiver's).
func TestDestinationTruncatedMidChunkFailsRoomReceiverServes(t *testing.T) {
	const item = 64 << 10
	l := UniformLayout(2, 64, item, 0, 0)
	d := &corruptingDialer{at: -1} // counts dials, corrupts nothing
	g := newRig(t, l, l, true, SenderConfig{ConnsPerPeer: 1, Dialer: d, MaxChunkBytes: 1 << 20}, ReceiverConfig{})
	hook, held, release := holdFirst()
	g.rcv.beforeTouch = hook
	for b := range 2 {
		fill(g.src.Buffer(b), uint64(b+1))
	}
	high := [][]Run{{}, {{32, 32}}}      // buffer 1's last 32 pages: cut by the truncation
	low := [][]Run{{{0, 16}}, {{0, 16}}} // below it
	expectSend := func(k Key, runs [][]Run) chan error {
		t.Helper()
		if err := g.rcv.Expect(Expectation{Key: k, Dst: runs, AuxRow: -1}); err != nil {
			t.Fatal(err)
		}
		return g.send(t, k, runs, runs, nil)
	}

	cut, next := Key{Room: 1, Nonce: 1}, Key{Room: 2, Nonce: 1}
	cutDone := expectSend(cut, high)
	waitClosed(t, held, "first piece into destination pages")
	nextDone := expectSend(next, low)
	if err := os.Truncate(g.dst.Path(), l.Size()-32*item); err != nil {
		t.Fatal(err)
	}
	close(release)
	if r := g.ev.wait(t, cut); r != ReasonTransferError {
		t.Fatalf("room on truncated pages: receiver outcome %q, want transfer_error", r)
	}
	if err := waitDone(t, cutDone); ReasonOf(err) != ReasonTransferError {
		t.Fatalf("room on truncated pages: sender got %v, want transfer_error", err)
	}
	if err := waitDone(t, nextDone); err != nil {
		t.Fatalf("room behind it on the same connection: %v", err)
	}
	if r := g.ev.wait(t, next); r != "" {
		t.Fatalf("room behind it: receiver outcome %q", r)
	}
	for b := range 2 {
		if !bytes.Equal(g.dst.Pages(b, low[b][0]), g.src.Pages(b, low[b][0])) {
			t.Fatalf("room behind it: buffer %d differs", b)
		}
	}
	if n := g.dst.Faults(); n < 1 {
		t.Fatalf("destination region faults %d, want at least 1", n)
	}
	g.rcv.Fence(cut)
	g.rcv.Fence(next)

	if err := os.Truncate(g.dst.Path(), l.Size()); err != nil {
		t.Fatal(err)
	}
	again := Key{Room: 3, Nonce: 1}
	if err := waitDone(t, expectSend(again, high)); err != nil {
		t.Fatalf("room into the pages that faulted, file whole again: %v", err)
	}
	if r := g.ev.wait(t, again); r != "" || !bytes.Equal(g.dst.Pages(1, high[1][0]), g.src.Pages(1, high[1][0])) {
		t.Fatalf("room into the pages that faulted: outcome %q or bytes differ", r)
	}
	g.rcv.Fence(again)
	if n := d.dials.Load(); n != 1 {
		t.Fatalf("%d dials: the connection was dropped", n)
	}
}

// fakeFault is what the runtime panics with on a fault under SetPanicOnFault.
type fakeFault struct{ addr uintptr }

func (f fakeFault) Error() string { return "fake fault" }
func (f fakeFault) RuntimeError() {}
func (f fakeFault) Addr() uintptr { return f.addr }

// repanics reports the value fn panicked with, or nil if it returned.
func repanics(fn func()) (v any) {
	defer func() { v = recover() }()
	fn()
	return nil
}

// TestFaultOutsideRegionsRepanics: only a fault inside a live mapping is recovered; one
// anywhere else (and any other panic) is a real bug and panics on with the same value.
func TestFaultOutsideRegionsRepanics(t *testing.T) {
	r := openTestRegion(t, UniformLayout(1, 4, 4096, 0, 0))
	log := zap.NewNop()
	var outside [64]byte
	for _, v := range []any{fakeFault{uintptr(unsafe.Pointer(&outside[8]))}, fakeFault{0}, "not a fault", errors.New("plain error")} {
		if got := repanics(func() { _ = recoverRegionFault(r, log, v) }); got != v {
			t.Fatalf("recoverRegionFault(%v) panicked with %v, want the same value again", v, got)
		}
	}
	if n := r.Faults(); n != 0 {
		t.Fatalf("faults counted for panics outside the region: %d", n)
	}
	inside := uintptr(unsafe.Pointer(&r.Buffer(0)[100]))
	var err error
	if got := repanics(func() { err = recoverRegionFault(r, log, fakeFault{inside}) }); got != nil {
		t.Fatalf("fault inside the region panicked on: %v", got)
	}
	var fe *RegionFaultError
	if !errors.As(err, &fe) || fe.Path != r.Path() || fe.Addr != inside || !errors.Is(err, ErrRegionFault) {
		t.Fatalf("fault inside the region: %v", err)
	}
	if n := r.Faults(); n != 1 {
		t.Fatalf("faults %d, want 1", n)
	}
}

// TestRealFaultOutsideRegionsRepanics: a real SIGBUS on a mapping that is not a region (a
// file this test maps itself, then truncates) is not taken for a truncated region: it panics
// on out of touchRegion, where this test recovers it, instead of failing a room. A real
// SIGBUS on a region is recovered into an error, and panic-on-fault is off again after both.
func TestRealFaultOutsideRegionsRepanics(t *testing.T) {
	r := openTestRegion(t, UniformLayout(1, 4, 4096, 0, 0))
	log := zap.NewNop()
	f, err := os.CreateTemp(t.TempDir(), "not-a-region-*")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(1 << 16); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	if err := f.Truncate(0); err != nil {
		t.Fatal(err)
	}
	v := repanics(func() { _ = touchRegion(r, log, nil, func() { mem[4096] = 1 }) })
	if _, ok := v.(faultAddr); !ok {
		t.Fatalf("fault outside every region: recovered %v, want the runtime's fault panicking on", v)
	}
	if n := r.Faults(); n != 0 {
		t.Fatalf("a fault outside the region was counted on it: %d", n)
	}

	if err := os.Truncate(r.Path(), 0); err != nil {
		t.Fatal(err)
	}
	page := r.Buffer(0)[8192:]
	err = touchRegion(r, log, nil, func() { page[0] = 1 })
	if !errors.Is(err, ErrRegionFault) || r.Faults() != 1 {
		t.Fatalf("fault inside the region: %v (faults %d), want a region fault", err, r.Faults())
	}
	if was := debug.SetPanicOnFault(false); was {
		t.Fatal("panic-on-fault left on after touchRegion")
	}
}

// TestAuxRowOfTruncatedSourceFailsSendNotDaemon: the daemon hands Send the aux row as a
// slice of its region, which Append copies; with the file truncated under it that copy
// faults. The Send fails with transfer_error, nothing is sent, and once the file has its
// size again the same room key sends whole.
func TestAuxRowOfTruncatedSourceFailsSendNotDaemon(t *testing.T) {
	l := UniformLayout(2, 8, 4096, 4, 64)
	g := newRig(t, l, l, false, SenderConfig{}, ReceiverConfig{})
	all := SamePages(2, []Run{{0, 8}})
	k := Key{Room: 1, Nonce: 1}
	if err := g.rcv.Expect(Expectation{Key: k, Dst: all, AuxRow: 2}); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(g.src.Path(), 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := g.snd.Send(ctx, SendRequest{Peer: g.addr, Key: k, Src: all, Dst: all, Aux: g.src.AuxRow(2),
		Done: func(err error) { t.Errorf("Done(%v) after a Send that failed", err) }})
	if ReasonOf(err) != ReasonTransferError || !errors.Is(err, ErrRegionFault) {
		t.Fatalf("Send with the aux row of a truncated region: %v; want transfer_error from a region fault", err)
	}
	if n := g.src.Faults(); n != 1 {
		t.Fatalf("faults %d, want 1", n)
	}

	if err := os.Truncate(g.src.Path(), l.Size()); err != nil {
		t.Fatal(err)
	}
	fill(g.src.Buffer(0), 3)
	memset(g.src.AuxRow(2), 9)
	if err := waitDone(t, g.send(t, k, all, all, g.src.AuxRow(2))); err != nil {
		t.Fatalf("the room again: %v", err)
	}
	if r := g.ev.wait(t, k); r != "" || !bytes.Equal(g.dst.AuxRow(2), g.src.AuxRow(2)) || !bytes.Equal(g.dst.Buffer(0), g.src.Buffer(0)) {
		t.Fatalf("the room again: outcome %q or bytes differ", r)
	}
	g.rcv.Fence(k)
}

// BenchmarkTouchRegion is what touchRegion adds to each access it guards (one per chunk
// checksum pass, chunk write and received piece): set and restore panic-on-fault, a
// deferred recover, the closure call.
func BenchmarkTouchRegion(b *testing.B) {
	r := openTestRegion(b, UniformLayout(1, 1, 4096, 0, 0))
	page := r.Buffer(0)
	log := zap.NewNop()
	var sink byte
	for b.Loop() {
		if err := touchRegion(r, log, nil, func() { sink += page[0] }); err != nil {
			b.Fatal(err)
		}
	}
	_ = sink
}
