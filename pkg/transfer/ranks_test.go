package transfer

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"
)

// TestEachRankReadsAndWritesItsOwnRegion: one Sender and one Receiver serve two ranks, each
// with its own region file on each side; a stream reads its Source rank's pages and the
// receiver writes its key's rank's, so the same page numbers of two ranks never mix. A key
// naming a rank with no region is refused (reason invalid), never read or written.
func TestEachRankReadsAndWritesItsOwnRegion(t *testing.T) {
	const item = 4096
	l := UniformLayout(1, 8, item, 2, 16)
	srcs, dsts := NewRegions(), NewRegions()
	var src, dst [2]*Region
	for i := range 2 {
		rank := Rank{TP: uint16(i), Size: 2}
		li := l
		li.Rank = rank
		src[i], dst[i] = openTestRegion(t, li), openTestRegion(t, li)
		fill(src[i].Buffer(0), uint64(10+i))
		copy(src[i].AuxRow(1), []byte{byte('a' + i)})
		srcs.Set(rank, src[i])
		dsts.Set(rank, dst[i])
	}
	ev := newEvents()
	rcv, err := NewReceiver(dsts, ReceiverConfig{}, ev)
	if err != nil {
		t.Fatal(err)
	}
	mem := NewMemNetwork()
	ln, err := mem.Listen("decode-0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); rcv.Serve(ln) }()
	snd, err := NewSender(srcs, SenderConfig{Dialer: mem})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { snd.Close(); rcv.Close(); <-served })
	peer := l
	peer.Rank = Rank{TP: 0, Size: 2}
	if err := snd.AddPeer("decode-0", peer); err != nil {
		t.Fatal(err)
	}
	runs := [][]Run{{{Start: 2, Count: 3}}}
	for i := range 2 {
		key := Key{Room: 1, Nonce: 1, Rank: Rank{TP: uint16(i), Size: 2}}
		if err := rcv.Expect(Expectation{Key: key, Dst: runs, AuxRow: 0}); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := snd.Send(ctx, SendRequest{Peer: "decode-0", Key: key, Src: runs, Dst: runs, Aux: src[i].AuxRow(1), Done: func(err error) { done <- err }})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if err := waitDone(t, done); err != nil {
			t.Fatalf("rank %d: %v", i, err)
		}
	}
	for i := range 2 {
		if got, want := dst[i].Pages(0, Run{Start: 2, Count: 3}), src[i].Pages(0, Run{Start: 2, Count: 3}); !bytes.Equal(got, want) {
			t.Fatalf("decode rank %d's pages are not prefill rank %d's", i, i)
		}
		if got := dst[i].AuxRow(0)[0]; got != byte('a'+i) {
			t.Fatalf("decode rank %d's aux row starts %q, want %q", i, got, byte('a'+i))
		}
	}
	lost := Key{Room: 2, Nonce: 1, Rank: Rank{TP: 2, Size: 4}}
	if err := rcv.Expect(Expectation{Key: lost, Dst: runs, AuxRow: -1}); !errors.Is(err, ErrNoRankRegion) {
		t.Fatalf("expect of a rank with no region: %v, want ErrNoRankRegion", err)
	}
	err = snd.Open(Stream{Peer: "decode-0", Key: lost, Dst: runs, Done: func(error) {}})
	if !errors.Is(err, ErrNoRankRegion) || ReasonOf(err) != ReasonInvalid {
		t.Fatalf("stream of a rank with no region: %v (reason %s), want ErrNoRankRegion, invalid", err, ReasonOf(err))
	}
}
