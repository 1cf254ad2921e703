package transfer

import (
	"hash/crc32"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestShmChunkStatsEachPrefillFileOncePerChunk: a shm chunk of many scattered runs, all
// from one prefill file, stats that file once before it copies, not once per run; the
// pages still land whole.
func TestShmChunkStatsEachPrefillFileOncePerChunk(t *testing.T) {
	l := faultLayout() // 64 KiB pages
	g := shmRig(t, l, KindShm, KindShm, SenderConfig{ConnsPerPeer: 1, MaxChunkBytes: 4 << 20}, ReceiverConfig{})
	var stats atomic.Int64
	g.rcv.beforeCheck = func() { stats.Add(1) }
	var srcRuns, dstRuns []Run
	for p := int32(0); p < 16; p++ { // 16 runs of one page per buffer: one chunk of 32 runs
		srcRuns = append(srcRuns, Run{Start: 2 * p, Count: 1})
		dstRuns = append(dstRuns, Run{Start: 63 - 2*p, Count: 1})
	}
	src, dst := SamePages(2, srcRuns), SamePages(2, dstRuns)
	k := Key{Room: 1, Nonce: 1}
	g.waitComplete(t, k, g.expectSend(t, k, src, dst, nil, -1))
	for b := range src {
		for i := range src[b] {
			if string(g.src.Pages(b, src[b][i])) != string(g.dst.Pages(b, dst[b][i])) {
				t.Fatalf("buffer %d run %d: destination differs from the source", b, i)
			}
		}
	}
	if n := stats.Load(); n != 1 {
		t.Fatalf("%d stats of the prefill file for one chunk of 32 runs, want 1", n)
	}
}

// replyLog records, for each write decode made on its data connections, how many COPIED
// frames it carried.
type replyLog struct {
	mu     sync.Mutex
	copied []int // per write that carried at least one COPIED
	conns  []net.Conn
}

func (l *replyLog) batches() []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.copied)
}

type loggedListener struct {
	net.Listener
	log *replyLog
}

func (ln loggedListener) Accept() (net.Conn, error) {
	c, err := ln.Listener.Accept()
	if err == nil {
		ln.log.mu.Lock()
		ln.log.conns = append(ln.log.conns, c)
		ln.log.mu.Unlock()
		c = loggedConn{c, ln.log}
	}
	return c, err
}

type loggedConn struct {
	net.Conn
	log *replyLog
}

func (c loggedConn) Write(b []byte) (int, error) {
	w, err := c.Conn.Write(b)
	if err != nil {
		return w, err
	}
	n := 0
	for off := 0; off+HeaderSize <= len(b); off += HeaderSize {
		if h, err := DecodeHeader(b[off:]); err == nil && h.Type == FrameCopied {
			n++
		}
	}
	if n > 0 {
		c.log.mu.Lock()
		c.log.copied = append(c.log.copied, n)
		c.log.mu.Unlock()
	}
	return w, nil
}

// loggedShmRig is shmRig (both sides shm) with decode's writes logged.
func loggedShmRig(t *testing.T, l Layout, sc SenderConfig, rc ReceiverConfig) (*rig, *replyLog) {
	t.Helper()
	sc.Transport, rc.Transport, sc.RedialMin = KindShm, KindShm, time.Millisecond
	log := &replyLog{}
	g := newRigServing(t, l, l, true, func(ln net.Listener) net.Listener { return loggedListener{ln, log} }, sc, rc)
	for b := range l.Buffers {
		fill(g.src.Buffer(b), uint64(b+1))
	}
	return g, log
}

// TestShmCopiedFramesGoSeveralPerWriteBudgetExact: chunks that reach decode while it
// copies an earlier one are answered with several COPIEDs in one write (at most
// maxQueuedReplies), every chunk is answered, and the sender's budget comes back to
// exactly zero. Decode holds its first copy until prefill announced all 8 chunks, so
// the other 7 frames are waiting when it goes on.
func TestShmCopiedFramesGoSeveralPerWriteBudgetExact(t *testing.T) {
	l := faultLayout() // 8 chunks of 1 MiB
	g, log := loggedShmRig(t, l, SenderConfig{ConnsPerPeer: 1, MaxChunkBytes: 1 << 20, MaxInflightBytes: 8 << 20}, ReceiverConfig{})
	held, letGo := holdFirstCopy(t, g.rcv)
	k := Key{Room: 1, Nonce: 1}
	all, done := g.sendWholeRoom(t, k)
	waitClosed(t, held, "first chunk copied")
	announced := waitAnnounced(t, g, 8)
	letGo()
	g.waitComplete(t, k, done)
	equalPages(t, g, all, all)
	g.rcv.Fence(k)
	waitBudget(t, g, 0)
	until(t, 10*time.Second, "every chunk answered", func() bool { return announced() == 0 })
	var batches []int
	total, most := 0, 0
	// A write is logged once it returned, which may be after prefill read it.
	until(t, 10*time.Second, "8 COPIED frames logged", func() bool {
		batches, total, most = log.batches(), 0, 0
		for _, n := range batches {
			total, most = total+n, max(most, n)
		}
		return total >= 8
	})
	if total != 8 || most < 2 || most > maxQueuedReplies {
		t.Fatalf("COPIED frames per write %v: want 8 in all, some writes with 2 to %d", batches, maxQueuedReplies)
	}
}

// TestShmQueuedCopiedGoOutBeforeDecodeWaits: under a budget of two chunks prefill can
// announce the third only after a COPIED; decode, having copied both, writes the COPIEDs
// it holds before it waits to read, so the room of 8 chunks completes (holding them for
// a batch would stall both sides until the idle timeout) and the budget ends at zero.
func TestShmQueuedCopiedGoOutBeforeDecodeWaits(t *testing.T) {
	l := faultLayout()
	g, _ := loggedShmRig(t, l, SenderConfig{ConnsPerPeer: 1, MaxChunkBytes: 1 << 20, MaxInflightBytes: 2 << 20},
		ReceiverConfig{IdleTimeout: time.Minute})
	all := SamePages(2, []Run{{0, 64}})
	for room := uint64(1); room <= 3; room++ {
		k := Key{Room: room, Nonce: 1}
		if err := waitDone(t, g.expectSend(t, k, all, all, nil, -1)); err != nil {
			t.Fatal(err)
		}
		if r := g.ev.wait(t, k); r != "" {
			t.Fatalf("room %d: receiver outcome %q", room, r)
		}
		g.rcv.Fence(k)
	}
	waitBudget(t, g, 0)
}

// TestShmCopiedQueuedWhenTheConnectionDiesGiveTheBudgetBack: decode's connection is cut
// while it copies a chunk and holds COPIEDs not yet written: those frames never arrive,
// and prefill, seeing the connection end, frees every chunk it announced on it. Its budget
// comes back to exactly zero, no chunk stays announced, and the room fails transfer_error
// on both sides (decode copied only chunks whose frames it read).
func TestShmCopiedQueuedWhenTheConnectionDiesGiveTheBudgetBack(t *testing.T) {
	l := faultLayout()
	g, log := loggedShmRig(t, l, SenderConfig{ConnsPerPeer: 1, MaxChunkBytes: 1 << 20, MaxInflightBytes: 8 << 20},
		ReceiverConfig{})
	hook, held, release := holdFirst()
	var pieces atomic.Int64
	cut := make(chan struct{})
	g.rcv.beforeTouch = func() {
		hook()
		// 4 pieces of 256 KiB per chunk: the 10th is inside the third chunk, after two
		// COPIEDs were queued behind frames already buffered.
		if pieces.Add(1) == 10 {
			log.mu.Lock()
			c := log.conns[0]
			log.mu.Unlock()
			c.Close()
			close(cut)
		}
	}
	letGo := releaseOnCleanup(t, release)
	k := Key{Room: 1, Nonce: 1}
	_, done := g.sendWholeRoom(t, k)
	waitClosed(t, held, "first chunk copied")
	announced := waitAnnounced(t, g, 8)
	letGo()
	waitClosed(t, cut, "connection cut mid-copy")
	if err := waitDone(t, done); ReasonOf(err) != ReasonTransferError {
		t.Fatalf("prefill Done(%v), want transfer_error", err)
	}
	if r := g.ev.wait(t, k); r != ReasonTransferError {
		t.Fatalf("receiver outcome %q, want transfer_error", r)
	}
	// Decode copied more chunks than it answered: the COPIEDs it held were lost with the
	// connection.
	written := 0
	for _, n := range log.batches() {
		written += n
	}
	if copied := g.rcv.ShmStats().CopiedBytes >> 20; int(copied) <= written {
		t.Fatalf("%d chunks copied, %d COPIED frames written: none was held when the connection died", copied, written)
	}
	waitBudget(t, g, 0)
	until(t, 10*time.Second, "no chunk announced", func() bool { return announced() == 0 })
}

// TestSumAheadEqualsCrc32cOfTheRunsEndToEnd: prefill's block-wise checksum with its
// touch-ahead is the crc32c of the runs' bytes end to end, whatever their sizes (empty,
// under a cache line, across block edges, not multiples of 64): the same sum, over the
// same bytes in the same order, as TCP's and decode's.
func TestSumAheadEqualsCrc32cOfTheRunsEndToEnd(t *testing.T) {
	data := make([]byte, 3*sumBlock+4096)
	fill(data, 9)
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 200 {
		var bufs [][]byte
		var whole []byte
		for off := 0; off < len(data); {
			n := min(len(data)-off, []int{0, 1, 63, 64, 65, sumBlock - 1, sumBlock, sumBlock + 1, rng.IntN(2 * sumBlock)}[rng.IntN(9)])
			bufs = append(bufs, data[off:off+n])
			whole = append(whole, data[off:off+n]...)
			off += n
			if rng.IntN(4) == 0 {
				break
			}
		}
		seed := uint32(trial)
		if got, want := sumAhead(seed, bufs), crc32.Update(seed, castagnoli, whole); got != want {
			t.Fatalf("trial %d, runs of %v bytes: sumAhead %#x, crc32c %#x", trial, lens(bufs), got, want)
		}
	}
}

func lens(bufs [][]byte) []int {
	out := make([]int, len(bufs))
	for i, b := range bufs {
		out[i] = len(b)
	}
	return out
}
