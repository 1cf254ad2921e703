package transfer

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// shmRig is a rig whose two sides run --data-transport send and recv over loopback TCP
// (the data connection), both regions under /dev/shm, source pages filled.
func shmRig(t *testing.T, l Layout, send, recv Kind, sc SenderConfig, rc ReceiverConfig) *rig {
	t.Helper()
	sc.Transport, rc.Transport = send, recv
	if sc.RedialMin == 0 {
		sc.RedialMin = time.Millisecond
	}
	g := newRig(t, l, l, true, sc, rc)
	for b := range l.Buffers {
		fill(g.src.Buffer(b), uint64(b+1))
	}
	return g
}

func (g *rig) expectSend(t *testing.T, k Key, src, dst [][]Run, aux []byte, row int64) chan error {
	t.Helper()
	if err := g.rcv.Expect(Expectation{Key: k, Dst: dst, AuxRow: row}); err != nil {
		t.Fatal(err)
	}
	return g.send(t, k, src, dst, aux)
}

func equalPages(t *testing.T, g *rig, src, dst [][]Run) {
	t.Helper()
	for b := range src {
		s, d := g.src.Pages(b, src[b][0]), g.dst.Pages(b, dst[b][0])
		if !bytes.Equal(s, d) {
			t.Fatalf("buffer %d: destination pages differ from the source's", b)
		}
	}
}

// TestShmCopiesPagesFromTheProvenMapping: with both sides on auto and one host, decode
// proves the prefill file and copies every page itself: bytes and aux row equal, the room
// complete on both sides, one offer accepted per side, and the copied bytes are the room's
// (nothing of it went as payload).
func TestShmCopiesPagesFromTheProvenMapping(t *testing.T) {
	l := faultLayout()
	for _, cs := range []Checksum{ChecksumCRC32C, ChecksumNone} {
		t.Run(string(cs), func(t *testing.T) {
			g := shmRig(t, l, KindAuto, KindAuto, SenderConfig{ConnsPerPeer: 1, Checksum: cs}, ReceiverConfig{Checksum: cs})
			src := [][]Run{{{0, 40}}, {{8, 40}}}
			dst := [][]Run{{{20, 40}}, {{0, 40}}}
			aux := bytes.Repeat([]byte{7}, 64)
			k := Key{Room: 1, Nonce: 1}
			if err := waitDone(t, g.expectSend(t, k, src, dst, aux, 2)); err != nil {
				t.Fatal(err)
			}
			if r := g.ev.wait(t, k); r != "" {
				t.Fatalf("receiver outcome %q", r)
			}
			equalPages(t, g, src, dst)
			if !bytes.Equal(g.dst.AuxRow(2), aux) {
				t.Fatal("aux row differs")
			}
			rs, ss := g.rcv.ShmStats(), g.snd.ShmStats()
			if rs.Accepted != 1 || ss.Accepted != 1 || rs.ShmConns != 1 || ss.ShmConns != 1 {
				t.Fatalf("accepted %d/%d, shm conns %d/%d; want one each", ss.Accepted, rs.Accepted, ss.ShmConns, rs.ShmConns)
			}
			if want := uint64(80 * (64 << 10)); rs.CopiedBytes != want {
				t.Fatalf("copied %d bytes by shm, want %d", rs.CopiedBytes, want)
			}
			g.rcv.Fence(k)
		})
	}
}

// TestShmFallsBackToTCPWhenDecodeCannotProveTheFile: decode on tcp declines the offer
// (disabled), the prefill file gone from its path is an open failure (the path decode
// cannot see), another file at the path is an identity failure; each falls back to TCP
// for that peer, counted on both sides by reason, and the room's bytes still arrive. With
// --data-transport=shm the same refusal fails the stream (ErrShmRefused) instead.
func TestShmFallsBackToTCPWhenDecodeCannotProveTheFile(t *testing.T) {
	l := faultLayout()
	all := SamePages(2, []Run{{0, 64}})
	for _, tc := range []struct {
		name   string
		recv   Kind
		spoil  func(t *testing.T, path string)
		reason ShmFallback
	}{
		{"disabled", KindTCP, nil, ShmDisabled},
		{"open", KindAuto, func(t *testing.T, path string) {
			if err := os.Rename(path, path+".moved"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Remove(path + ".moved") })
		}, ShmOpen},
		{"identity", KindAuto, func(t *testing.T, path string) {
			if err := os.Rename(path, path+".old"); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.Remove(path + ".old") })
			if err := os.WriteFile(path, make([]byte, l.Size()), 0o600); err != nil {
				t.Fatal(err)
			}
		}, ShmIdentity},
	} {
		for _, send := range []Kind{KindAuto, KindShm} {
			t.Run(tc.name+"/"+string(send), func(t *testing.T) {
				g := shmRig(t, l, send, tc.recv, SenderConfig{ConnsPerPeer: 1}, ReceiverConfig{})
				if tc.spoil != nil {
					tc.spoil(t, g.src.Path())
				}
				k := Key{Room: 1, Nonce: 1}
				err := waitDone(t, g.expectSend(t, k, all, all, nil, -1))
				ss, rs := g.snd.ShmStats(), g.rcv.ShmStats()
				if ss.Fallbacks[tc.reason.String()] != 1 || rs.Fallbacks[tc.reason.String()] != 1 || ss.Accepted+rs.Accepted != 0 {
					t.Fatalf("fallbacks sender %v receiver %v accepted %d/%d; want one %s each",
						ss.Fallbacks, rs.Fallbacks, ss.Accepted, rs.Accepted, tc.reason)
				}
				if send == KindShm {
					if ReasonOf(err) != ReasonTransferError || !errors.Is(err, ErrShmRefused) {
						t.Fatalf("shm-only stream on a refused peer: %v; want transfer_error ErrShmRefused", err)
					}
					g.rcv.Fence(k)
					return
				}
				if err != nil {
					t.Fatalf("room over the tcp fallback: %v", err)
				}
				if r := g.ev.wait(t, k); r != "" {
					t.Fatalf("receiver outcome %q", r)
				}
				equalPages(t, g, all, all)
				if rs.CopiedBytes != 0 {
					t.Fatalf("%d bytes copied by shm on a refused peer", rs.CopiedBytes)
				}
				g.rcv.Fence(k)
			})
		}
	}
}

// TestShmFenceMidCopyLandsNoLaterByte_R7: decode fences a room while its first piece is
// being copied from the prefill mapping. The fence waits for that piece (I9), OnFenced
// follows, and no byte past that piece ever lands, though the sender announced more: every
// later chunk is discarded and answered, so the sender's stream ends and its budget
// comes back. With two copy workers each worker's part of the first chunk may have one
// piece in progress at the fence (the second starts half way into the chunk), no more.
func TestShmFenceMidCopyLandsNoLaterByte_R7(t *testing.T) {
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprintf("workers%d", workers), func(t *testing.T) { testShmFenceMidCopy(t, workers) })
	}
}

func testShmFenceMidCopy(t *testing.T, workers int) {
	l := faultLayout()
	fenced := make(chan Key, 1)
	const piece, chunk = 64 << 10, 1 << 20
	g := shmRig(t, l, KindAuto, KindAuto, SenderConfig{ConnsPerPeer: 1, MaxChunkBytes: chunk},
		ReceiverConfig{PieceBytes: piece, CopyWorkers: workers, OnFenced: func(k Key) { fenced <- k }})
	held, letGo := holdFirstCopy(t, g.rcv)
	all := SamePages(2, []Run{{0, 64}})
	k := Key{Room: 1, Nonce: 1}
	done := g.expectSend(t, k, all, all, nil, -1)
	waitClosed(t, held, "first piece copied from the prefill mapping")
	if g.rcv.Fence(k) {
		t.Fatal("fence done while a piece was being copied")
	}
	letGo()
	waitFenced(t, fenced, k)
	snapshot := bytes.Clone(g.dst.Buffer(0))
	err := waitDone(t, done)
	if err == nil {
		t.Fatal("fenced room reported success to the sender")
	}
	if !bytes.Equal(g.dst.Buffer(0), snapshot) {
		t.Fatal("destination changed after the fence was done")
	}
	inProgress := func(off int) bool { // a byte of a worker's first piece of the first chunk
		for w := range workers {
			if start := chunk * w / workers; off >= start && off < start+piece {
				return true
			}
		}
		return false
	}
	for off, b := range g.dst.Buffer(0) {
		if b != 0 && !inProgress(off) {
			t.Fatalf("byte %d landed: past the pieces in progress at the fence", off)
		}
	}
	if !bytes.Equal(g.dst.Buffer(1), make([]byte, len(g.dst.Buffer(1)))) {
		t.Fatal("buffer 1 (after the fence) was written")
	}
	waitBudget(t, g, 0)
}

// waitBudget waits until the sender's only peer holds want bytes of its budget.
func waitBudget(t *testing.T, g *rig, want int64) {
	t.Helper()
	p := g.snd.peers[g.addr]
	until(t, 10*time.Second, fmt.Sprintf("the peer budget to hold %d bytes", want), func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.inflight == want
	})
}

// TestShmBudgetBoundsAnnouncedNotCopied: while decode is held mid-copy, prefill announces
// no more than its in-flight budget: a shm chunk's bytes come back at COPIED, not when its
// (tiny) frame is written. Over the hold the sender keeps exactly two 1 MiB chunks
// announced under a 2 MiB budget; once released, the room completes.
func TestShmBudgetBoundsAnnouncedNotCopied(t *testing.T) {
	l := faultLayout()
	g := shmRig(t, l, KindAuto, KindAuto, SenderConfig{ConnsPerPeer: 1, MaxChunkBytes: 1 << 20, MaxInflightBytes: 2 << 20},
		ReceiverConfig{})
	held, letGo := holdFirstCopy(t, g.rcv)
	k := Key{Room: 1, Nonce: 1}
	all, done := g.sendWholeRoom(t, k) // 8 chunks
	waitClosed(t, held, "first piece copied from the prefill mapping")
	announced := waitAnnounced(t, g, 2)
	// The hold lasts; over it, nothing beyond the budget may be announced.
	// Sampled every millisecond for 100 ms: what is checked is that a
	// condition stays false while nothing changes, so there is no event to
	// wait for instead.
	for range 100 {
		if n := announced(); n > 2 {
			t.Fatalf("%d MiB announced and not copied under a 2 MiB budget", n)
		}
		time.Sleep(time.Millisecond)
	}
	letGo()
	g.waitComplete(t, k, done)
	equalPages(t, g, all, all)
	g.rcv.Fence(k)
	waitBudget(t, g, 0)
}

// TestShmSourceTruncatedMidCopyFailsRoomDecodeServes: the prefill file is truncated to 0
// while decode copies a room's first piece from it. The copy faults (SIGBUS) inside
// touchRegion: the room fails transfer_error on both sides, the fault is counted, the
// process lives, and the same connection serves the next room once the file is whole.
func TestShmSourceTruncatedMidCopyFailsRoomDecodeServes(t *testing.T) {
	for _, workers := range []int{1, 2} {
		t.Run(fmt.Sprintf("workers%d", workers), func(t *testing.T) { testShmSourceTruncatedMidCopy(t, workers) })
	}
}

// testShmSourceTruncatedMidCopy: each copy worker in the faulting chunk counts its fault.
func testShmSourceTruncatedMidCopy(t *testing.T, workers int) {
	l := faultLayout()
	d := &corruptingDialer{at: -1}
	g := shmRig(t, l, KindAuto, KindAuto, SenderConfig{ConnsPerPeer: 1, Dialer: d, Checksum: ChecksumNone},
		ReceiverConfig{Checksum: ChecksumNone, CopyWorkers: workers})
	held, letGo := holdFirstCopy(t, g.rcv)
	all := SamePages(2, []Run{{0, 64}})
	k1 := Key{Room: 1, Nonce: 1}
	done := g.expectSend(t, k1, all, all, nil, -1)
	waitClosed(t, held, "first piece copied from the prefill mapping")
	if err := os.Truncate(g.src.Path(), 0); err != nil {
		t.Fatal(err)
	}
	letGo()
	if r := g.ev.wait(t, k1); r != ReasonTransferError {
		t.Fatalf("room on a truncated prefill file: receiver outcome %q, want transfer_error", r)
	}
	if err := waitDone(t, done); ReasonOf(err) != ReasonTransferError {
		t.Fatalf("room on a truncated prefill file: sender got %v, want transfer_error", err)
	}
	if n := g.dst.Faults(); n < 1 || n > uint64(workers) {
		t.Fatalf("faults %d, want 1 to %d", n, workers)
	}
	g.rcv.Fence(k1)
	if err := os.Truncate(g.src.Path(), l.Size()); err != nil {
		t.Fatal(err)
	}
	for b := range 2 {
		fill(g.src.Buffer(b), uint64(b+20))
	}
	k2 := Key{Room: 2, Nonce: 1}
	if err := waitDone(t, g.expectSend(t, k2, all, all, nil, -1)); err != nil {
		t.Fatalf("room after the file is whole again: %v", err)
	}
	equalPages(t, g, all, all)
	if n := d.dials.Load(); n != 1 {
		t.Fatalf("%d dials: the connection was dropped", n)
	}
	g.rcv.Fence(k2)
}

// TestShmReplacedPrefillFileFailsRoomThenNewGenerationServes: the prefill file is replaced
// at its path (what an engine restart does) while a room is mid-copy and a second room's
// chunks are announced on the same offer. Both fail region_replaced on both sides, the
// reason prefill gives when it notices a replaced file itself (decode stats the file
// before each chunk; the second room's chunks name the offer decode then dropped), never
// Success with bytes of the retired inode, and neither transfer_error nor invalid; after
// prefill installs the new file as generation 2 the next room is offered again on the
// same connection and lands the new file's bytes.
func TestShmReplacedPrefillFileFailsRoomThenNewGenerationServes(t *testing.T) {
	l := faultLayout()
	g := shmRig(t, l, KindAuto, KindAuto, SenderConfig{ConnsPerPeer: 1, MaxChunkBytes: 1 << 20}, ReceiverConfig{PieceBytes: 1 << 20})
	held, letGo := holdFirstCopy(t, g.rcv)
	all := SamePages(2, []Run{{0, 64}})
	k1 := Key{Room: 1, Nonce: 1}
	done := g.expectSend(t, k1, all, all, nil, -1)
	waitClosed(t, held, "first chunk copied from the prefill mapping")
	k3 := Key{Room: 3, Nonce: 1}
	second := SamePages(2, []Run{{0, 4}})
	done3 := g.expectSend(t, k3, second, second, nil, -1)
	path := g.src.Path()
	tmp := filepath.Join(filepath.Dir(path), filepath.Base(path)+".next")
	if err := os.WriteFile(tmp, make([]byte, l.Size()), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	letGo()
	for k, done := range map[Key]chan error{k1: done, k3: done3} {
		if r := g.ev.wait(t, k); r != ReasonRegionReplaced {
			t.Errorf("room %v on a replaced prefill file: receiver outcome %q, want region_replaced", k, r)
		}
		if err := waitDone(t, done); ReasonOf(err) != ReasonRegionReplaced || !errors.Is(err, ErrRegionReplaced) {
			t.Errorf("room %v on a replaced prefill file: sender got %v, want region_replaced", k, err)
		}
	}
	if rest := g.dst.Buffer(0)[1<<20:]; !bytes.Equal(rest, make([]byte, len(rest))) {
		t.Fatal("pages of the retired inode landed after the replacement")
	}
	g.rcv.Fence(k1)
	g.rcv.Fence(k3)

	next, err := OpenMapping(path, l)
	if err != nil {
		t.Fatal(err)
	}
	old := g.src.Replace(next, 2)
	t.Cleanup(func() { old.Close() })
	for b := range 2 {
		fill(g.src.Buffer(b), uint64(b+30))
	}
	k2 := Key{Room: 2, Nonce: 1}
	if err := waitDone(t, g.expectSend(t, k2, all, all, nil, -1)); err != nil {
		t.Fatalf("room on generation 2: %v", err)
	}
	equalPages(t, g, all, all)
	if rs := g.rcv.ShmStats(); rs.Accepted != 2 {
		t.Fatalf("%d offers accepted, want 2 (one per generation)", rs.Accepted)
	}
	g.rcv.Fence(k2)
}

// releaseOnCleanup returns the way to close release once, and closes it at the test's end
// if the test did not (a failed test must not leave the receiver held: Close waits for it).
func releaseOnCleanup(t *testing.T, release chan struct{}) func() {
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	t.Cleanup(letGo)
	return letGo
}

// holdFirstCopy makes rcv's first access to a room's pages (a shm copy) wait, from held,
// until letGo runs (at the test's end at the latest).
func holdFirstCopy(t *testing.T, rcv *Receiver) (held <-chan struct{}, letGo func()) {
	hook, h, release := holdFirst()
	rcv.beforeTouch = hook
	return h, releaseOnCleanup(t, release)
}

// waitFenced waits for the one OnFenced report on fenced and checks that it names k.
func waitFenced(t *testing.T, fenced <-chan Key, k Key) {
	t.Helper()
	select {
	case got := <-fenced:
		if got != k {
			t.Fatalf("OnFenced(%v), want %v", got, k)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no OnFenced within 10s")
	}
}

// sendWholeRoom expects room k on every page of both buffers and streams it as one last
// piece, page i to page i; it returns the pages and the channel of the sender's Done.
func (g *rig) sendWholeRoom(t *testing.T, k Key) ([][]Run, chan error) {
	t.Helper()
	all := SamePages(2, []Run{{0, 64}})
	if err := g.rcv.Expect(Expectation{Key: k, Dst: all, AuxRow: -1}); err != nil {
		t.Fatal(err)
	}
	done := g.openStream(t, k, all)
	g.append(t, k, Piece{Src: all, Last: true})
	return all, done
}

// waitComplete waits for the room's Done on the sender and its outcome on the receiver,
// both complete.
func (g *rig) waitComplete(t *testing.T, k Key, done chan error) {
	t.Helper()
	if err := waitDone(t, done); err != nil {
		t.Fatal(err)
	}
	if r := g.ev.wait(t, k); r != "" {
		t.Fatalf("receiver outcome %q", r)
	}
}

// TestShmPrefillFenceWaitsForDecodesCopy_I9: on the same-host path decode reads prefill's
// pages, so prefill's Fence of a room whose chunk decode is copying is not done (the
// engine may not reuse the pages yet) until that copy ended and COPIED came back; OnFenced
// then follows once and the room's Done never runs.
func TestShmPrefillFenceWaitsForDecodesCopy_I9(t *testing.T) {
	l := faultLayout()
	fenced := make(chan Key, 1)
	g := shmRig(t, l, KindAuto, KindAuto, SenderConfig{ConnsPerPeer: 1, OnFenced: func(k Key) { fenced <- k }}, ReceiverConfig{})
	held, letGo := holdFirstCopy(t, g.rcv)
	k := Key{Room: 1, Nonce: 1}
	_, done := g.sendWholeRoom(t, k)
	waitClosed(t, held, "decode copying the first chunk from prefill's pages")
	waitAnnounced(t, g, 8) // every chunk written: prefill itself reads none of the pages now
	if g.snd.Fence(k) {
		t.Fatal("prefill fence done while decode copies the room's pages")
	}
	select {
	case <-fenced:
		t.Fatal("OnFenced before decode's copy ended")
	default:
	}
	letGo()
	select {
	case got := <-fenced:
		if got != k {
			t.Fatalf("OnFenced(%v), want %v", got, k)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no OnFenced within 10s of the copy's end")
	}
	select {
	case err := <-done:
		t.Fatalf("Done(%v) ran for a fenced room", err)
	default:
	}
	g.rcv.Fence(k)
}

// waitAnnounced waits until the sender's only connection has n shm chunks written and not
// yet COPIED, and returns how to count them again.
func waitAnnounced(t *testing.T, g *rig, n int) func() int {
	t.Helper()
	p := g.snd.peers[g.addr]
	var tc *txConn
	announced := func() int {
		if tc == nil {
			p.mu.Lock()
			for c := range p.conns {
				tc = c
			}
			p.mu.Unlock()
			if tc == nil {
				return 0
			}
		}
		tc.mu.Lock()
		defer tc.mu.Unlock()
		return len(tc.shm.acks)
	}
	until(t, 10*time.Second, fmt.Sprintf("%d chunks announced", n), func() bool { return announced() >= n })
	return announced
}

// TestShmCopyWorkersSplitChunksMidRunLandExactBytes: a chunk copied by two or three
// workers is split at cache-line edges inside runs of pages whose size is no multiple of
// 64, over scattered runs; every destination page holds its source page, and the room
// succeeds with crc32c on, so the workers' sums combined equal prefill's sum of the whole
// chunk.
func TestShmCopyWorkersSplitChunksMidRunLandExactBytes(t *testing.T) {
	const pages, itemLen = 48, 4100
	l := UniformLayout(2, pages, itemLen, 4, 64)
	srcPages, dstPages := make([]int32, 0, pages), make([]int32, 0, pages)
	for p := range int32(pages) {
		srcPages = append(srcPages, (p*7)%pages) // 7 is prime to 48: a permutation
		dstPages = append(dstPages, (p*11+5)%pages)
	}
	for _, workers := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("workers%d", workers), func(t *testing.T) {
			g := shmRig(t, l, KindAuto, KindAuto, SenderConfig{ConnsPerPeer: 1, MaxChunkBytes: 10 * itemLen},
				ReceiverConfig{PieceBytes: 4096, CopyWorkers: workers})
			src, dst := SamePages(2, RunsFromPages(srcPages)), SamePages(2, RunsFromPages(dstPages))
			k := Key{Room: 1, Nonce: 1}
			g.waitComplete(t, k, g.expectSend(t, k, src, dst, nil, -1))
			for b := range 2 {
				for i := range srcPages {
					s := g.src.Pages(b, Run{Start: srcPages[i], Count: 1})
					if d := g.dst.Pages(b, Run{Start: dstPages[i], Count: 1}); !bytes.Equal(s, d) {
						t.Fatalf("buffer %d: destination page %d differs from source page %d", b, dstPages[i], srcPages[i])
					}
				}
			}
			if rs := g.rcv.ShmStats(); rs.CopiedBytes != 2*pages*itemLen {
				t.Fatalf("copied %d bytes by shm, want %d", rs.CopiedBytes, 2*pages*itemLen)
			}
			g.rcv.Fence(k)
		})
	}
}
