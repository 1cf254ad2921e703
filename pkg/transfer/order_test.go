package transfer

import (
	"context"
	"net"
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

// neverDialer never connects: the slots' queues fill and nothing takes pieces from them.
type neverDialer struct{}

func (neverDialer) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// TestAdmissionFeedsTheSlotWithFewestAdmittedBytes: two slots, a budget of three pages all
// admitted onto slot 0 (streams A and C), A's later pieces and B's only piece (slot 1)
// waiting, A closed before B. When C's page comes back, B's piece is admitted, so both
// connections have work; admitting by close order alone took A's next piece and left
// slot 1 idle (back to back, 2.6 instead of 3.1 GB/s on one connection instead of two).
func TestAdmissionFeedsTheSlotWithFewestAdmittedBytes(t *testing.T) {
	const item = 4096
	l := UniformLayout(1, 16, item, 0, 0)
	src := openTestRegion(t, l)
	snd, err := NewSender(src, SenderConfig{ConnsPerPeer: 2, MaxChunkBytes: item, MaxInflightBytes: 3 * item, Dialer: neverDialer{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { snd.Close() })
	const addr = "decode-0"
	if err := snd.AddPeer(addr, l); err != nil {
		t.Fatal(err)
	}
	a, b, c := Key{Room: 1, Nonce: 1}, Key{Room: 2, Nonce: 1}, Key{Room: 3, Nonce: 1}
	open := func(k Key, dst []Run) {
		if err := snd.Open(Stream{Peer: addr, Key: k, Dst: [][]Run{dst}}); err != nil {
			t.Fatal(err)
		}
	}
	add := func(k Key, page int32, last bool) {
		if err := snd.Append(k, Piece{Src: [][]Run{{{page, 1}}}, Last: last}); err != nil {
			t.Fatal(err)
		}
	}
	open(a, []Run{{0, 4}})    // slot 0
	open(b, []Run{{4, 1}})    // slot 1
	open(c, []Run{{5, 2}})    // slot 0 again
	add(c, 5, false)          // admitted
	for i := range int32(4) { // A1, A2 admitted; A3, A4 wait; A closes
		add(a, i, i == 3)
	}
	add(b, 4, true) // waits
	snd.mu.Lock()
	p := snd.peers[addr]
	jb := snd.jobs[b]
	snd.mu.Unlock()
	p.mu.Lock()
	if jb.slot != 1 || p.slots[0].inflight != 3*item || jb.unadmitted != 1 {
		p.mu.Unlock()
		t.Fatalf("setup: B on slot %d, slot 0 holds %d B, B has %d pieces waiting", jb.slot, p.slots[0].inflight, jb.unadmitted)
	}
	p.mu.Unlock()
	if !snd.Fence(c) { // C's page comes back to the budget
		t.Fatal("fence of a stream no writer holds not done")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if jb.unadmitted != 0 || p.slots[1].inflight != item {
		t.Fatalf("B not admitted onto idle slot 1 (slot 0 holds %d B, slot 1 %d B)", p.slots[0].inflight, p.slots[1].inflight)
	}
}

// TestClosingStreamIsAdmittedChunkByChunkPastAPartlyAdmittedPiece: an open stream A has
// one piece of 64 chunks queued against a budget of 4 chunks, its first write held, when a
// stream B appends its only, last, one-chunk piece. B's piece is admitted (its Admitted
// event: the last Send's answer) as soon as one chunk of A's comes back, while A's piece is
// still only partly admitted, and B's chunk goes on the wire next, before A's admitted
// chunks. With whole-piece admission A's piece took the budget whole and B waited for 61
// of its chunks to be written; without the writer's yield B waited behind A's admitted
// chunks (the budget's).
func TestClosingStreamIsAdmittedChunkByChunkPastAPartlyAdmittedPiece(t *testing.T) {
	const item, aChunks, budget = 4096, 64, 4
	l := UniformLayout(1, aChunks+1, item, 0, 0)
	d := newGateDialer()
	g := newRig(t, l, l, true, SenderConfig{ConnsPerPeer: 1, Dialer: d, MaxChunkBytes: item, MaxInflightBytes: budget * item},
		ReceiverConfig{})
	t.Cleanup(d.lift)
	a, b := Key{Room: 1, Nonce: 1}, Key{Room: 2, Nonce: 1}
	aDst, bDst := []Run{{0, aChunks}}, []Run{{aChunks, 1}}
	for k, dst := range map[Key][]Run{a: aDst, b: bDst} {
		if err := g.rcv.Expect(Expectation{Key: k, Dst: [][]Run{dst}, AuxRow: -1}); err != nil {
			t.Fatal(err)
		}
	}
	d.shut()
	aDone := g.openStream(t, a, [][]Run{aDst})
	g.append(t, a, Piece{Src: [][]Run{aDst}})
	waitFor(t, func() bool { return d.inW.Load() > 0 }) // A's first chunk is held in its write

	g.snd.mu.Lock()
	p, ja := g.snd.peers[g.addr], g.snd.jobs[a]
	g.snd.mu.Unlock()
	aUnadmitted := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return ja.unadmitted
	}
	admitted := make(chan int, 1) // A's pieces still waiting for the budget when B's was admitted
	bDone := make(chan error, 1)
	if err := g.snd.Open(Stream{Peer: g.addr, Key: b, Dst: [][]Run{bDst}, Done: func(err error) { bDone <- err },
		Admitted: func() { admitted <- aUnadmitted() }}); err != nil {
		t.Fatal(err)
	}
	g.append(t, b, Piece{Src: [][]Run{bDst}, Last: true})
	select {
	case n := <-admitted:
		t.Fatalf("B admitted with the budget full of A's chunks (A has %d pieces waiting)", n)
	default:
	}

	d.lift()
	select {
	case n := <-admitted:
		if n != 1 {
			t.Fatalf("B admitted once A's piece was admitted whole (A has %d pieces waiting, want 1)", n)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("B's last piece not admitted within 10s")
	}
	if err := waitDone(t, bDone); err != nil {
		t.Fatalf("B: %v", err)
	}
	g.append(t, a, Piece{Src: [][]Run{nil}, Last: true}) // A's DONE alone
	if err := waitDone(t, aDone); err != nil {
		t.Fatalf("A: %v", err)
	}
	d.mu.Lock()
	var order []Key
	for _, h := range d.frames {
		if h.Type == FrameChunk {
			order = append(order, h.Key())
		}
	}
	d.mu.Unlock()
	// The writer lets A's admitted chunks wait for B's (closing streams first, chunk by
	// chunk): only the chunk in its write when B was admitted goes first.
	if n := chunksBefore(order, b); n != 1 {
		t.Fatalf("B's chunk went after %d of A's, want 1 (the one in its write; %d admitted)", n, budget)
	}
}
