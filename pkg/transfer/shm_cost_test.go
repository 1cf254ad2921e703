package transfer

import (
	"sync/atomic"
	"testing"
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
	if err := waitDone(t, g.expectSend(t, k, src, dst, nil, -1)); err != nil {
		t.Fatal(err)
	}
	if r := g.ev.wait(t, k); r != "" {
		t.Fatalf("receiver outcome %q", r)
	}
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
