package transfer

import (
	"context"
	"net"
	"testing"
	"time"
)

// BenchmarkOnePageRooms64Buffers moves one-page rooms of 64 buffers of 256 B pages (the
// small-room layout of pdctl bench --bytes-per-token 1024), 64 in flight, through one Sender
// and one Receiver in this process over loopback TCP: the data plane's own cost per room,
// without gRPC, the control link or the schedulers. allocs/op counts both sides.
func BenchmarkOnePageRooms64Buffers(b *testing.B) { benchOnePageRooms(b, 64, 256) }

// BenchmarkOnePageRooms2Buffers is the same with 2 buffers of 512 B pages (--layers 1
// --bytes-per-token 64).
func BenchmarkOnePageRooms2Buffers(b *testing.B) { benchOnePageRooms(b, 2, 512) }

func benchOnePageRooms(b *testing.B, nbuf int, item int64) {
	const inflight = 64
	l := UniformLayout(nbuf, inflight, item, inflight, 16)
	src, dst := openTestRegion(b, l), openTestRegion(b, l)
	rcv, err := NewReceiver(dst, ReceiverConfig{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	served := make(chan struct{})
	go func() { defer close(served); rcv.Serve(ln) }()
	snd, err := NewSender(src, SenderConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { snd.Close(); rcv.Close(); <-served }()
	addr := ln.Addr().String()
	if err := snd.AddPeer(addr, l); err != nil {
		b.Fatal(err)
	}
	free := make(chan int, inflight) // page and aux row slots not in flight
	for i := range inflight {
		free <- i
	}
	aux := make([]byte, 16)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		slot := <-free
		k := Key{Room: uint64(i + 1), Nonce: 1, Rank: Rank{TP: 0, Size: 1}}
		runs := SamePages(nbuf, []Run{{Start: int32(slot), Count: 1}})
		if err := rcv.Expect(Expectation{Key: k, Dst: runs, AuxRow: int64(slot)}); err != nil {
			b.Fatal(err)
		}
		err := snd.Send(ctx, SendRequest{Peer: addr, Key: k, Src: runs, Dst: runs, Aux: aux, Done: func(err error) {
			if err != nil {
				b.Errorf("room %v: %v", k, err)
			}
			rcv.Fence(k)
			free <- slot
		}})
		if err != nil {
			b.Fatal(err)
		}
	}
	for range inflight {
		<-free
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "rooms/s")
}
