package transfer

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// orderRun streams a long stream L of lPieces one-page pieces over one connection (closed
// by its last piece if longClosing), holds the receiver on L's first chunk, then appends a
// short stream S's only, last, piece, lets the receiver go and returns the order of the
// chunks the receiver took (by key). budget 0 is the default (L's pieces all in the slot's
// queue); one page makes L's pieces wait for the budget.
func orderRun(t *testing.T, budget int64, longClosing bool) (taken []Key, long, short Key) {
	const item, lPieces = 4096, 11
	l := UniformLayout(1, 16, item, 0, 0)
	g := newRig(t, l, l, false, SenderConfig{ConnsPerPeer: 1, MaxChunkBytes: item, MaxInflightBytes: budget},
		ReceiverConfig{PieceBytes: item})
	long, short = Key{Room: 1, Nonce: 1}, Key{Room: 2, Nonce: 1}
	var mu sync.Mutex
	var order []Key // appended to until the rig closes
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
		g.append(t, long, Piece{Src: [][]Run{{{i, 1}}}, Last: longClosing && i == lPieces-1})
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
	if longClosing {
		if err := waitDone(t, lDone); err != nil {
			t.Fatalf("long stream: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	return slices.Clone(order), long, short
}

// chunksBefore counts the chunks in order before k's first.
func chunksBefore(order []Key, k Key) int {
	if i := slices.Index(order, k); i >= 0 {
		return i
	}
	return len(order)
}

// TestClosingStreamIsNotStarvedBehindALongStream: while a long stream L, still open, has
// ten pieces queued on the one connection, a short stream S appends its only, last, piece.
// S's chunk goes next, after at most the piece of L already being written, whether L's
// pieces wait for the budget or sit in the slot's queue. With FIFO order S waited for all
// of L's pieces: with rooms back to back, a room's last chunk waited for every other
// room's pieces interleaved ahead of it.
func TestClosingStreamIsNotStarvedBehindALongStream(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget int64
	}{{"budget", 4096}, {"slot-queue", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			order, long, short := orderRun(t, tc.budget, false)
			// L's first chunk (held) and the one its writer had taken may precede S.
			if n := chunksBefore(order, short); n > 2 || order[0] != long {
				t.Fatalf("%d of the long stream's chunks went before the short stream's last: %v", n, order)
			}
		})
	}
}

// TestClosingStreamsGoInTheOrderTheyClosed: a long stream L that closed before a short
// stream S is written whole before S; S does not overtake it for having fewer bytes. When
// the fewest queued bytes went first, rooms back to back overtook a long room again and
// again: first Send -> Success p99 rose from 0.5 s to 4 s.
func TestClosingStreamsGoInTheOrderTheyClosed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget int64
	}{{"budget", 4096}, {"slot-queue", 0}} {
		t.Run(tc.name, func(t *testing.T) {
			order, _, short := orderRun(t, tc.budget, true)
			if n := chunksBefore(order, short); n != 11 {
				t.Fatalf("the short stream, closed after the long one, went after %d of its 11 chunks: %v", n, order)
			}
		})
	}
}
