package transfer

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// TestTwoRanksOfARoomAreTwoKeys: two ranks of one room and nonce are two
// keys. Both may be expected; frames name their rank (wire v2), so a rank's
// stream lands in its own pages and completes its own key only; a fence of
// one leaves the other expected.
func TestTwoRanksOfARoomAreTwoKeys(t *testing.T) {
	const item = 4096
	l := UniformLayout(1, 8, item, 0, 0)
	g := newRig(t, l, l, false, SenderConfig{}, ReceiverConfig{})
	fill(g.src.Buffer(0), 3)
	memset(g.dst.Buffer(0), 0xAA)
	room := Key{Room: 1, Nonce: 1}
	rank0, rank1 := room, room
	rank0.Rank, rank1.Rank = Rank{TP: 0, Size: 2}, Rank{TP: 1, Size: 2}
	if err := g.rcv.Expect(Expectation{Key: rank0, Dst: [][]Run{{{Start: 0, Count: 2}}}, AuxRow: -1}); err != nil {
		t.Fatal(err)
	}
	if err := g.rcv.Expect(Expectation{Key: rank1, Dst: [][]Run{{{Start: 2, Count: 2}}}, AuxRow: -1}); err != nil {
		t.Fatalf("expect %v beside %v: %v", rank1, rank0, err)
	}
	if err := g.rcv.Expect(Expectation{Key: rank1, Dst: [][]Run{{{Start: 2, Count: 2}}}, AuxRow: -1}); !errors.Is(err, ErrDuplicateRoom) {
		t.Fatalf("expect %v twice: %v, want ErrDuplicateRoom", rank1, err)
	}
	src, dst := [][]Run{{{Start: 0, Count: 2}}}, [][]Run{{{Start: 2, Count: 2}}}

	if err := waitDone(t, g.send(t, rank1, src, dst, nil)); err != nil {
		t.Fatalf("send %v beside an expected %v: %v", rank1, rank0, err)
	}
	if r, ok := g.ev.get(rank1); !ok || r != "" {
		t.Fatalf("%v: outcome %q (reported %v), want complete under its own key", rank1, r, ok)
	}
	for _, k := range []Key{rank0, room} {
		if r, ok := g.ev.get(k); ok {
			t.Fatalf("%v has outcome %q: only %v was sent", k, r, rank1)
		}
	}
	if !bytes.Equal(g.dst.Buffer(0)[2*item:4*item], g.src.Buffer(0)[:2*item]) {
		t.Fatal("rank 1's pages are not in place")
	}
	if !bytes.Equal(g.dst.Buffer(0)[:2*item], bytes.Repeat([]byte{0xAA}, 2*item)) {
		t.Fatal("rank 1's frames were written into rank 0's pages")
	}

	if !g.rcv.Fence(rank0) {
		t.Fatalf("fence of idle %v not done", rank0)
	}
	if err := g.rcv.Expect(Expectation{Key: rank1, Dst: dst, AuxRow: -1}); !errors.Is(err, ErrDuplicateRoom) {
		t.Fatalf("a fence of %v forgot %v (expect again: %v)", rank0, rank1, err)
	}
	for _, k := range []Key{rank1, rank0} {
		if !g.rcv.Fence(k) {
			t.Fatalf("fence of idle %v not done", k)
		}
		if err := g.rcv.Expect(Expectation{Key: k, Dst: dst, AuxRow: -1}); err != nil {
			t.Fatalf("expect %v after its fence: %v", k, err)
		}
	}
}

// TestTwoRanksOfOneRoomTransferConcurrently: both ranks of a room stream at once on one
// connection, their pieces and chunks interleaved on the wire; each rank completes, under
// its own key, with its own source pages in its own destination pages and its own aux row.
// A receiver that took a frame for the wrong rank fails it (its pages are not that rank's)
// or completes a rank with the other's bytes.
func TestTwoRanksOfOneRoomTransferConcurrently(t *testing.T) {
	const item = 4096
	l := UniformLayout(2, 16, item, 2, 16)
	tap := &tapDialer{}
	g := newRig(t, l, l, true, SenderConfig{ConnsPerPeer: 1, MaxChunkBytes: 2 * item, Dialer: tap}, ReceiverConfig{})
	fill(g.src.Buffer(0), 11)
	fill(g.src.Buffer(1), 12)
	memset(g.dst.Buffer(0), 0xAA)
	memset(g.dst.Buffer(1), 0xAA)
	rank0 := Key{Room: 9, Nonce: 4, Rank: Rank{TP: 0, Size: 2}}
	rank1 := Key{Room: 9, Nonce: 4, Rank: Rank{TP: 1, Size: 2}}
	type share struct {
		key      Key
		src, dst []Run
		auxRow   int64
		aux      []byte
		done     chan error
	}
	shares := []*share{
		{key: rank0, src: []Run{{0, 6}}, dst: []Run{{0, 6}}, auxRow: 0, aux: bytes.Repeat([]byte{1}, 16)},
		{key: rank1, src: []Run{{8, 6}}, dst: []Run{{6, 6}}, auxRow: 1, aux: bytes.Repeat([]byte{2}, 16)},
	}
	for _, s := range shares {
		if err := g.rcv.Expect(Expectation{Key: s.key, Dst: SamePages(2, s.dst), AuxRow: s.auxRow}); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range shares {
		s.done = g.openStream(t, s.key, SamePages(2, s.dst))
	}
	var at int64
	for i, n := range []int64{2, 1, 3} {
		last := i == 2
		for _, s := range shares {
			p := Piece{Src: SamePages(2, runsAt(s.src, at, n)), Last: last}
			if last {
				p.Aux = s.aux
			}
			g.append(t, s.key, p)
		}
		at += n
		if !last { // each round is on the wire before the next: the ranks' chunks interleave
			until(t, 10*time.Second, "round written", func() bool {
				return g.ev.bytes(rank0) == 2*at*item && g.ev.bytes(rank1) == 2*at*item
			})
		}
	}
	for _, s := range shares {
		if err := waitDone(t, s.done); err != nil {
			t.Fatalf("%v: %v", s.key, err)
		}
		if r, ok := g.ev.get(s.key); !ok || r != "" {
			t.Fatalf("%v: outcome %q (reported %v), want complete", s.key, r, ok)
		}
		for b := range 2 {
			want := g.src.Pages(b, s.src[0])
			if !bytes.Equal(g.dst.Pages(b, s.dst[0]), want) {
				t.Fatalf("%v: buffer %d destination pages do not hold its own source pages", s.key, b)
			}
		}
		if !bytes.Equal(g.dst.AuxRow(s.auxRow), s.aux) {
			t.Fatalf("%v: aux row %d is not its own", s.key, s.auxRow)
		}
	}
	for b := range 2 {
		if rest := g.dst.Pages(b, Run{12, 4}); !bytes.Equal(rest, bytes.Repeat([]byte{0xAA}, len(rest))) {
			t.Fatalf("buffer %d: bytes landed outside both ranks' pages", b)
		}
	}
	switches, last := 0, Key{}
	for _, h := range tap.frames(t) {
		if h.Type == FrameChunk && h.Key() != last {
			switches++
			last = h.Key()
		}
	}
	if switches < 4 {
		t.Fatalf("the ranks' chunks switched %d times on the connection: they did not interleave", switches)
	}
	if _, ok := g.ev.get(Key{Room: 9, Nonce: 4}); ok {
		t.Fatal("the room without a rank has an outcome")
	}
}

// TestSenderTakesSeveralRanksOfARoom: while one rank of a room is being sent
// another rank of it opens and queues; a fence of that other rank's key stops
// only its own stream, and the rank being sent completes.
func TestSenderTakesSeveralRanksOfARoom(t *testing.T) {
	const item = 4096
	l := UniformLayout(1, 8, item, 0, 0)
	d := newGateDialer()
	g := newRig(t, l, l, true, SenderConfig{ConnsPerPeer: 1, Dialer: d, MaxChunkBytes: item}, ReceiverConfig{})
	t.Cleanup(d.lift)
	rank0 := Key{Room: 1, Nonce: 1, Rank: Rank{TP: 0, Size: 2}}
	rank1 := Key{Room: 1, Nonce: 1, Rank: Rank{TP: 1, Size: 2}}
	runs0, runs1 := [][]Run{{{Start: 0, Count: 2}}}, [][]Run{{{Start: 2, Count: 2}}}
	if err := g.rcv.Expect(Expectation{Key: rank0, Dst: runs0, AuxRow: -1}); err != nil {
		t.Fatal(err)
	}
	if err := g.rcv.Expect(Expectation{Key: rank1, Dst: runs1, AuxRow: -1}); err != nil {
		t.Fatal(err)
	}
	d.shut()
	done := g.send(t, rank0, runs0, runs0, nil)
	waitFor(t, func() bool { return d.inW.Load() > 0 }) // rank 0's first chunk is being written
	err := g.snd.Send(context.Background(), SendRequest{Peer: g.addr, Key: rank1, Src: runs1, Dst: runs1,
		Done: func(err error) { t.Errorf("Done of fenced %v: %v", rank1, err) }})
	if err != nil {
		t.Fatalf("send %v while %v is in flight: %v", rank1, rank0, err)
	}
	if !g.snd.Fence(rank1) {
		t.Fatalf("fence of %v, queued behind %v's write, not done at once", rank1, rank0)
	}
	d.lift()
	if err := waitDone(t, done); err != nil {
		t.Fatalf("%v after a fence of %v: %v", rank0, rank1, err)
	}
	if r, ok := g.ev.get(rank0); !ok || r != "" {
		t.Fatalf("%v: outcome %q (reported %v), want complete", rank0, r, ok)
	}
	if n := d.chunksOf(rank1); n != 0 {
		t.Fatalf("%d chunks of fenced %v were written", n, rank1)
	}
	g.rcv.Fence(rank0)
	g.rcv.Fence(rank1)
}

// A key shows its rank only when the room has several, so log lines of
// engines without tensor parallelism read as before.
func TestKeyStringShowsTheRankOnlyWhenThereAreSeveral(t *testing.T) {
	for k, want := range map[Key]string{
		{Room: 7, Nonce: 42}:                             "7/42",
		{Room: 7, Nonce: 42, Rank: Rank{TP: 0, Size: 1}}: "7/42",
		{Room: 7, Nonce: 42, Rank: Rank{TP: 1, Size: 2}}: "7/42 rank 1/2",
	} {
		if got := k.String(); got != want {
			t.Errorf("%#v.String() = %q, want %q", k, got, want)
		}
	}
}
