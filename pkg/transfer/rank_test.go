package transfer

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

// TestTwoRanksOfARoomAreTwoKeys: two ranks of one room and nonce are two
// keys. Both may be expected; a fence of one leaves the other expected;
// the completion names the rank that completed (the Expectation's key,
// since v1 frames carry no rank) and only that one. While both are
// expected, frames of the room cannot say which rank they are for and
// land in neither.
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

	err := waitDone(t, g.send(t, rank1, src, dst, nil))
	if ReasonOf(err) != ReasonFenced {
		t.Fatalf("frames of a room expected under two ranks: done %v, want refused as fenced", err)
	}
	for _, k := range []Key{rank0, rank1} {
		if r, ok := g.ev.get(k); ok {
			t.Fatalf("%v has outcome %q from frames that do not say their rank", k, r)
		}
	}
	if !bytes.Equal(g.dst.Buffer(0)[:4*item], bytes.Repeat([]byte{0xAA}, 4*item)) {
		t.Fatal("frames that do not say their rank were written")
	}

	if !g.rcv.Fence(rank0) {
		t.Fatalf("fence of idle %v not done", rank0)
	}
	if err := g.rcv.Expect(Expectation{Key: rank1, Dst: dst, AuxRow: -1}); !errors.Is(err, ErrDuplicateRoom) {
		t.Fatalf("after fencing %v, %v is no longer expected (expect again: %v)", rank0, rank1, err)
	}
	if err := waitDone(t, g.send(t, rank1, src, dst, nil)); err != nil {
		t.Fatalf("send %v once it is the room's only rank: %v", rank1, err)
	}
	if r, ok := g.ev.get(rank1); !ok || r != "" {
		t.Fatalf("%v: outcome %q (reported %v), want complete under its own key", rank1, r, ok)
	}
	for _, k := range []Key{rank0, room} {
		if r, ok := g.ev.get(k); ok {
			t.Fatalf("%v has outcome %q: only %v completed", k, r, rank1)
		}
	}
	if !bytes.Equal(g.dst.Buffer(0)[2*item:4*item], g.src.Buffer(0)[:2*item]) {
		t.Fatal("rank 1's pages are not in place")
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

// TestSenderTakesOneRankOfARoomAtATime: v1 frames cannot say which rank
// they carry, so while one rank of a room is being sent another rank of
// it is refused; and a fence of that other rank's key is not a fence of
// the rank being sent, which completes.
func TestSenderTakesOneRankOfARoomAtATime(t *testing.T) {
	const item = 4096
	l := UniformLayout(1, 8, item, 0, 0)
	d := newGateDialer()
	g := newRig(t, l, l, true, SenderConfig{ConnsPerPeer: 1, Dialer: d, MaxChunkBytes: item}, ReceiverConfig{})
	t.Cleanup(d.lift)
	rank0 := Key{Room: 1, Nonce: 1, Rank: Rank{TP: 0, Size: 2}}
	rank1 := Key{Room: 1, Nonce: 1, Rank: Rank{TP: 1, Size: 2}}
	runs := [][]Run{{{Start: 0, Count: 2}}}
	if err := g.rcv.Expect(Expectation{Key: rank0, Dst: runs, AuxRow: -1}); err != nil {
		t.Fatal(err)
	}
	d.shut()
	done := g.send(t, rank0, runs, runs, nil)
	waitFor(t, func() bool { return d.inW.Load() > 0 }) // rank 0's first chunk is being written
	err := g.snd.Send(context.Background(), SendRequest{Peer: g.addr, Key: rank1, Src: runs, Dst: runs, Done: func(error) {}})
	if !errors.Is(err, ErrDuplicateRoom) {
		t.Fatalf("send %v while %v is in flight: %v, want ErrDuplicateRoom", rank1, rank0, err)
	}
	if !g.snd.Fence(rank1) {
		t.Fatalf("fence of %v, which is not being sent, not done at once", rank1)
	}
	d.lift()
	if err := waitDone(t, done); err != nil {
		t.Fatalf("%v after a fence of %v: %v", rank0, rank1, err)
	}
	if r, ok := g.ev.get(rank0); !ok || r != "" {
		t.Fatalf("%v: outcome %q (reported %v), want complete", rank0, r, ok)
	}
	g.rcv.Fence(rank0)
}
