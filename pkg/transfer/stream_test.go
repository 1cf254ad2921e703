package transfer

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// until polls cond every 2ms until it holds, failing the test after bound.
func until(t testing.TB, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, bound)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// openStream opens a stream of k over the rig and returns a channel with its Done error.
func (g *rig) openStream(t testing.TB, k Key, dst [][]Run) chan error {
	t.Helper()
	done := make(chan error, 1)
	if err := g.snd.Open(Stream{Peer: g.addr, Key: k, Dst: dst, Done: func(err error) { done <- err }}); err != nil {
		t.Fatalf("open %v: %v", k, err)
	}
	return done
}

func (g *rig) append(t testing.TB, k Key, p Piece) {
	t.Helper()
	if err := g.snd.Append(k, p); err != nil {
		t.Fatalf("append to %v: %v", k, err)
	}
}

func (e *events) bytes(k Key) int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.progress[k]
}

// TestPagesGoOnTheWireBeforeTheLastSend: the first piece of a stream is written, verified
// and reported by the receiver while the stream is still open (its last piece not even
// appended), so its transfer overlaps the engine computing the rest.
func TestPagesGoOnTheWireBeforeTheLastSend(t *testing.T) {
	const item = 4096
	l := UniformLayout(2, 16, item, 2, 16)
	for _, tcp := range []bool{true, false} {
		g := newRig(t, l, l, tcp, SenderConfig{MaxChunkBytes: 2 * item}, ReceiverConfig{})
		fill(g.src.Buffer(0), 1)
		fill(g.src.Buffer(1), 2)
		fill(g.src.AuxRow(1), 3)
		k := Key{Room: 1, Nonce: 7}
		dst := SamePages(2, []Run{{8, 8}})
		if err := g.rcv.Expect(Expectation{Key: k, Dst: dst, AuxRow: 0}); err != nil {
			t.Fatal(err)
		}
		done := g.openStream(t, k, dst)
		g.append(t, k, Piece{Src: SamePages(2, []Run{{0, 3}})})
		until(t, 10*time.Second, "first piece verified by the receiver", func() bool { return g.ev.bytes(k) == 2*3*item })
		if _, over := g.ev.get(k); over {
			t.Fatal("room has an outcome before its last piece")
		}
		if !bytes.Equal(g.dst.Pages(0, Run{8, 3}), g.src.Pages(0, Run{0, 3})) || !bytes.Equal(g.dst.Pages(1, Run{8, 3}), g.src.Pages(1, Run{0, 3})) {
			t.Fatal("first piece's pages not in the destination before the last piece")
		}
		g.append(t, k, Piece{Src: SamePages(2, []Run{{3, 5}}), Last: true, Aux: g.src.AuxRow(1)})
		if err := waitDone(t, done); err != nil {
			t.Fatal(err)
		}
		if r := g.ev.wait(t, k); r != "" {
			t.Fatalf("receiver outcome %q", r)
		}
		for b := range 2 {
			if !bytes.Equal(g.dst.Pages(b, Run{8, 8}), g.src.Pages(b, Run{0, 8})) {
				t.Fatalf("buffer %d differs", b)
			}
		}
		if !bytes.Equal(g.dst.AuxRow(0), g.src.AuxRow(1)) {
			t.Fatal("aux row differs")
		}
	}
}

// tapDialer keeps a copy of every byte its connections wrote (each write recorded before it
// returns to the writer), to read the frames back. inner defaults to a net.Dialer.
type tapDialer struct {
	inner Dialer
	mu    sync.Mutex
	bytes []byte
}

func (d *tapDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	inner := d.inner
	if inner == nil {
		inner = &net.Dialer{}
	}
	c, err := inner.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &tapConn{Conn: c, d: d}, nil
}

type tapConn struct {
	net.Conn
	d *tapDialer
}

func (c *tapConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.d.mu.Lock()
	c.d.bytes = append(c.d.bytes, p[:n]...)
	c.d.mu.Unlock()
	return n, err
}

func (d *tapDialer) written() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.bytes)
}

// frames decodes every frame written so far (one connection: ConnsPerPeer 1).
func (d *tapDialer) frames(t testing.TB) []Header {
	t.Helper()
	return d.framesFrom(t, 0)
}

// framesFrom decodes the frames written so far that start at or after byte from.
func (d *tapDialer) framesFrom(t testing.TB, from int) []Header {
	t.Helper()
	d.mu.Lock()
	b := bytes.NewReader(append([]byte(nil), d.bytes...))
	d.mu.Unlock()
	var out []Header
	var hdr [HeaderSize]byte
	for {
		if _, err := io.ReadFull(b, hdr[:]); err == io.EOF {
			return out
		} else if err != nil {
			t.Fatal(err)
		}
		h, err := DecodeHeader(hdr[:])
		if err != nil {
			t.Fatal(err)
		}
		at := int(b.Size()) - b.Len() - HeaderSize
		skip := int64(h.PayloadLen) + int64(h.NumRuns)*runSize
		if _, err := b.Seek(skip, io.SeekCurrent); err != nil {
			t.Fatal(err)
		}
		if at >= from {
			out = append(out, h)
		}
	}
}

// streamInPieces appends dst's positions to k in pieces of the given sizes (every buffer the
// same pages), the last with aux, and waits for both sides' outcome.
func streamInPieces(t *testing.T, g *rig, k Key, src []Run, sizes []int32, aux []byte, nbuf int) chan error {
	t.Helper()
	done := g.openStream(t, k, SamePages(nbuf, src))
	var at int64
	for i, n := range sizes {
		last := i == len(sizes)-1
		p := Piece{Src: SamePages(nbuf, runsAt(src, at, int64(n))), Last: last}
		if last {
			p.Aux = aux
		}
		g.append(t, k, p)
		at += int64(n)
	}
	return done
}

// TestDoneTotalsCountEveryPieceAcrossSends: a room appended in several pieces over two
// buffers ends with one DONE whose totals are the whole stream's (chunks and pages of every
// piece, not of the last one), and the receiver confirms it.
func TestDoneTotalsCountEveryPieceAcrossSends(t *testing.T) {
	const item = 4096
	l := UniformLayout(2, 32, item, 1, 16)
	tap := &tapDialer{}
	g := newRig(t, l, l, true, SenderConfig{ConnsPerPeer: 1, MaxChunkBytes: 2 * item, Dialer: tap}, ReceiverConfig{})
	fill(g.src.Buffer(0), 4)
	fill(g.src.Buffer(1), 5)
	k := Key{Room: 3, Nonce: 1}
	pages := []Run{{0, 5}, {10, 6}} // 11 positions
	if err := g.rcv.Expect(Expectation{Key: k, Dst: SamePages(2, pages), AuxRow: 0}); err != nil {
		t.Fatal(err)
	}
	done := streamInPieces(t, g, k, pages, []int32{3, 1, 4, 3}, bytes.Repeat([]byte{9}, 16), 2)
	if err := waitDone(t, done); err != nil {
		t.Fatal(err)
	}
	var chunks uint32
	var chunkPages uint32
	var dones []Header
	for _, h := range tap.frames(t) {
		switch h.Type {
		case FrameChunk:
			chunks++
			chunkPages += h.Pages
		case FrameDone:
			dones = append(dones, h)
		}
	}
	if len(dones) != 1 {
		t.Fatalf("%d DONE frames, want 1", len(dones))
	}
	if d := dones[0]; d.Seq != chunks || d.Pages != 2*11 || chunkPages != 2*11 {
		t.Fatalf("DONE seq %d pages %d; the stream wrote %d chunks of %d pages, want 22 pages", d.Seq, d.Pages, chunks, chunkPages)
	}
	// Every piece's chunks were counted, and a piece's chunks span both buffers: pieces of
	// 3, 1, 4 and 3 positions are 6, 2, 8 and 6 page-buffer pairs, at most 2 per chunk.
	if chunks != 3+1+4+3 {
		t.Fatalf("%d chunks for 4 pieces over 2 buffers, want 11", chunks)
	}
}

// TestChunkSeqIsPerStreamAcrossPieces: two streams whose pieces interleave on one connection
// each number their chunks 0, 1, 2, ... across all their pieces, so the receiver's strict
// sequence check holds for both.
func TestChunkSeqIsPerStreamAcrossPieces(t *testing.T) {
	const item = 4096
	l := UniformLayout(1, 32, item, 0, 0)
	tap := &tapDialer{}
	g := newRig(t, l, l, true, SenderConfig{ConnsPerPeer: 1, MaxChunkBytes: item, Dialer: tap}, ReceiverConfig{})
	a, b := Key{Room: 1, Nonce: 1}, Key{Room: 2, Nonce: 1}
	pa, pb := []Run{{0, 16}}, []Run{{16, 16}}
	for k, p := range map[Key][]Run{a: pa, b: pb} {
		if err := g.rcv.Expect(Expectation{Key: k, Dst: [][]Run{p}, AuxRow: -1}); err != nil {
			t.Fatal(err)
		}
	}
	doneA := g.openStream(t, a, [][]Run{pa})
	doneB := g.openStream(t, b, [][]Run{pb})
	var at int64
	for i, n := range []int64{2, 5, 1, 8} {
		last := i == 3
		g.append(t, a, Piece{Src: [][]Run{runsAt(pa, at, n)}, Last: last})
		g.append(t, b, Piece{Src: [][]Run{runsAt(pb, at, n)}, Last: last})
		// Interleave on the wire: each round's pieces are written before the next round's.
		until(t, 10*time.Second, "round written", func() bool { return g.ev.bytes(a) == (at+n)*item && g.ev.bytes(b) == (at+n)*item })
		at += n
	}
	for _, d := range []chan error{doneA, doneB} {
		if err := waitDone(t, d); err != nil {
			t.Fatal(err)
		}
	}
	next := map[uint64]uint32{}
	switches, last := 0, uint64(0)
	for _, h := range tap.frames(t) {
		if h.Type != FrameChunk && h.Type != FrameDone {
			continue
		}
		if h.Seq != next[h.Room] {
			t.Fatalf("room %d: %v frame seq %d, want %d", h.Room, h.Type, h.Seq, next[h.Room])
		}
		if h.Type == FrameChunk {
			next[h.Room]++
		}
		if h.Room != last {
			switches++
			last = h.Room
		}
	}
	if next[1] != 16 || next[2] != 16 {
		t.Fatalf("chunks per room %v, want 16 each", next)
	}
	if switches < 6 {
		t.Fatalf("the streams' frames switched %d times on the connection: pieces did not interleave", switches)
	}
}

// TestStreamLargerThanTheBudgetDoesNotWaitOnItself: a room of three times the peer's
// in-flight budget, appended in six pieces at once, completes: each chunk gives its bytes back
// as its write returns, so later pieces are admitted while the stream is still open.
func TestStreamLargerThanTheBudgetDoesNotWaitOnItself(t *testing.T) {
	const item = 4096
	const budget = 8 * item
	l := UniformLayout(1, 24, item, 0, 0)
	g := newRig(t, l, l, true, SenderConfig{ConnsPerPeer: 1, MaxInflightBytes: budget, MaxChunkBytes: item}, ReceiverConfig{})
	fill(g.src.Buffer(0), 6)
	k := Key{Room: 5, Nonce: 2}
	pages := []Run{{0, 24}}
	if err := g.rcv.Expect(Expectation{Key: k, Dst: [][]Run{pages}, AuxRow: -1}); err != nil {
		t.Fatal(err)
	}
	done := streamInPieces(t, g, k, pages, []int32{4, 4, 4, 4, 4, 4}, nil, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.snd.WaitAdmitted(ctx, k); err != nil {
		t.Fatalf("six pieces of a stream three times the budget not admitted: %v", err)
	}
	if err := waitDone(t, done); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(g.dst.Buffer(0), g.src.Buffer(0)) {
		t.Fatal("pages differ")
	}
	g.snd.mu.Lock()
	p := g.snd.peers[g.addr]
	g.snd.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.inflight != 0 {
		t.Fatalf("%d bytes still charged after the stream ended", p.inflight)
	}
}

// TestPropertyNoByteIsSentAfterAFenceMidStream: a room streamed in random pieces is fenced
// by the sender at a random point (the room still open, its last piece not appended) while
// its writes are held; from the moment the fence is done (Fence returned true, or OnFenced
// ran) not one more frame of the room goes on the wire: its queued pieces are dropped and a
// later Append is refused. A marker room queued behind them on the same connection shows
// that everything queued before it was handled.
func TestPropertyNoByteIsSentAfterAFenceMidStream(t *testing.T) {
	const item, pages = 4096, 48
	l := UniformLayout(1, pages+1, item, 0, 0)
	fenced := make(chan Key, 1)
	d := newPacedDialer()
	tap := &tapDialer{inner: d}
	g := newRig(t, l, l, true, SenderConfig{ConnsPerPeer: 1, MaxChunkBytes: 2 * item, Dialer: tap, FenceGrace: time.Minute,
		OnFenced: func(k Key) { fenced <- k }}, ReceiverConfig{})
	t.Cleanup(d.release)
	fill(g.src.Buffer(0), 8)
	var room uint64
	pending := 0
	rapid.Check(t, func(rt *rapid.T) {
		room++
		k, marker := Key{Room: room, Nonce: 1}, Key{Room: room, Nonce: 2}
		n := rapid.IntRange(2, pages).Draw(rt, "pages")
		runs := []Run{{0, int32(n)}}
		if err := g.rcv.Expect(Expectation{Key: k, Dst: [][]Run{runs}, AuxRow: -1}); err != nil {
			rt.Fatal(err)
		}
		defer g.rcv.Fence(k)
		d.allow(rapid.Int64Range(0, int64(n*item/pacedPart+n/2+2)).Draw(rt, "parts_before_fence"))
		done := g.openStream(t, k, [][]Run{runs})
		var at int64
		for at < int64(n-1) { // every piece but the last: the stream stays open
			m := rapid.Int64Range(1, int64(n-1)-at).Draw(rt, "piece")
			g.append(t, k, Piece{Src: [][]Run{runsAt(runs, at, m)}})
			at += m
		}
		until(t, 10*time.Second, "writer held or stream written", func() bool {
			return d.held() || g.ev.bytes(k) == int64(n-1)*item
		})
		var mark int
		if g.snd.Fence(k) {
			mark = tap.written()
		} else {
			pending++
			d.release()
			select {
			case got := <-fenced:
				if got != k {
					rt.Fatalf("OnFenced(%v), want %v", got, k)
				}
				mark = tap.written()
			case <-time.After(10 * time.Second):
				rt.Fatal("fence neither done nor reported by OnFenced")
			}
		}
		if err := g.snd.Append(k, Piece{Src: [][]Run{runsAt(runs, at, int64(n)-at)}, Last: true}); err == nil {
			rt.Fatal("Append after the fence was taken")
		}
		d.release()
		// The marker is pinned to the same (only) connection, behind anything of k still queued.
		mruns := [][]Run{{{int32(pages), 1}}}
		if err := g.rcv.Expect(Expectation{Key: marker, Dst: mruns, AuxRow: -1}); err != nil {
			rt.Fatal(err)
		}
		if err := waitDone(t, g.send(t, marker, mruns, mruns, nil)); err != nil {
			rt.Fatal(err)
		}
		select {
		case err := <-done:
			rt.Fatalf("Done(%v) ran for a fenced stream", err)
		default:
		}
		for _, h := range tap.framesFrom(t, mark) {
			if h.Room == k.Room && h.Nonce == k.Nonce {
				rt.Fatalf("%v frame seq %d of the fenced stream sent after its fence was done", h.Type, h.Seq)
			}
		}
	})
	t.Logf("%d of %d fences found a write in progress", pending, room)
}
