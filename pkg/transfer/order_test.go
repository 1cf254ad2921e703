package transfer

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestClosingStreamIsNotStarvedBehindALongStream: a long stream L has ten pieces queued on
// the one connection while the receiver holds its first chunk; then a short stream S
// appends its only, last, piece. S's chunk goes next, after at most the piece of L already
// being written, whether L is still open or closing (then S has fewer bytes queued), and
// whether L's pieces wait for the budget or sit in the slot's queue. With FIFO order S
// waited for all ten of L's pieces: with rooms back to back, a room's last chunk waited for
// every other room's pieces interleaved ahead of it.
func TestClosingStreamIsNotStarvedBehindALongStream(t *testing.T) {
	const item, lPieces = 4096, 11
	for _, tc := range []struct {
		name        string
		budget      int64
		longClosing bool
	}{
		{"budget/long-open", item, false},
		{"budget/long-closing", item, true},
		{"slot-queue/long-open", 0, false},
		{"slot-queue/long-closing", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := UniformLayout(1, 16, item, 0, 0)
			g := newRig(t, l, l, false, SenderConfig{ConnsPerPeer: 1, MaxChunkBytes: item, MaxInflightBytes: tc.budget},
				ReceiverConfig{PieceBytes: item})
			long, short := Key{Room: 1, Nonce: 1}, Key{Room: 2, Nonce: 1}
			var mu sync.Mutex
			var order []Key
			hold := make(chan struct{})
			held := make(chan struct{})
			g.ev2(func(k Key) {
				mu.Lock()
				order = append(order, k)
				first := len(order) == 1
				mu.Unlock()
				if first { // the receiver stops reading: the writer blocks mid-piece
					close(held)
					<-hold
				}
			})
			lDst := []Run{{0, lPieces}}
			if err := g.rcv.Expect(Expectation{Key: long, Dst: [][]Run{lDst}, AuxRow: -1}); err != nil {
				t.Fatal(err)
			}
			if err := g.rcv.Expect(Expectation{Key: short, Dst: [][]Run{{{lPieces, 1}}}, AuxRow: -1}); err != nil {
				t.Fatal(err)
			}
			lDone := g.openStream(t, long, [][]Run{lDst})
			for i := range int32(lPieces) {
				g.append(t, long, Piece{Src: [][]Run{{{i, 1}}}, Last: tc.longClosing && i == lPieces-1})
			}
			select {
			case <-held:
			case <-time.After(10 * time.Second):
				t.Fatal("first chunk of the long stream not received within 10s")
			}
			sDone := g.openStream(t, short, [][]Run{{{lPieces, 1}}})
			g.append(t, short, Piece{Src: [][]Run{{{lPieces, 1}}}, Last: true})
			close(hold)
			if err := waitDone(t, sDone); err != nil {
				t.Fatalf("short stream: %v", err)
			}
			mu.Lock()
			before := 0
			for _, k := range order {
				if k == short {
					break
				}
				before++
			}
			got := fmt.Sprint(order)
			mu.Unlock()
			// L's first chunk (held) and the one its writer had taken may precede S.
			if before > 2 {
				t.Fatalf("%d of the long stream's chunks went before the short stream's last: %s", before, got)
			}
			if tc.longClosing {
				if err := waitDone(t, lDone); err != nil {
					t.Fatalf("long stream: %v", err)
				}
			}
		})
	}
}
