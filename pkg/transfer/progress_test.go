package transfer

import (
	"sync"
	"testing"
	"time"
)

// A stream reports each written chunk's bytes to its driver (Stream.Progress) as it goes,
// before the stream's Done: prefill's room owner refreshes the room's transfer-idle
// deadline with it, so a last Send whose pages take long to move is not failed as idle.
func TestStreamReportsProgressForEveryWrittenChunk(t *testing.T) {
	const item = 4096
	l := UniformLayout(2, 16, item, 2, 16)
	for _, tcp := range []bool{true, false} {
		g := newRig(t, l, l, tcp, SenderConfig{MaxChunkBytes: 2 * item}, ReceiverConfig{})
		k := Key{Room: 3, Nonce: 9}
		dst := SamePages(2, []Run{{0, 8}})
		if err := g.rcv.Expect(Expectation{Key: k, Dst: dst, AuxRow: 0}); err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var reports, reported int64
		done := make(chan error, 1)
		err := g.snd.Open(Stream{Peer: g.addr, Key: k, Dst: dst,
			Done: func(err error) { done <- err },
			Progress: func(n int64) {
				mu.Lock()
				defer mu.Unlock()
				reports++
				reported += n
			}})
		if err != nil {
			t.Fatal(err)
		}
		progressed := func() (int64, int64) {
			mu.Lock()
			defer mu.Unlock()
			return reports, reported
		}
		g.append(t, k, Piece{Src: SamePages(2, []Run{{0, 3}})})
		until(t, 10*time.Second, "the first piece's chunks reported", func() bool { _, b := progressed(); return b == 2*3*item })
		select {
		case err := <-done:
			t.Fatalf("stream done (%v) before its last piece", err)
		default:
		}
		g.append(t, k, Piece{Src: SamePages(2, []Run{{3, 5}}), Last: true, Aux: g.src.AuxRow(1)})
		if err := waitDone(t, done); err != nil {
			t.Fatal(err)
		}
		// 16 pages of 4 KiB in chunks of at most 2 pages: at least 8 chunks, each reported.
		if n, b := progressed(); b != 2*8*item || n < 8 {
			t.Fatalf("tcp=%v: %d reports of %d bytes, want >= 8 reports of %d bytes", tcp, n, b, 2*8*item)
		}
	}
}
