package transfer

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// silentDecode accepts data connections on ln and reads everything, answering nothing: a
// decode that took the connection and hangs. offers gets the number of each connection
// (from 0) on which a SHM_OFFER arrived.
func silentDecode(t *testing.T, ln net.Listener) (offers chan int) {
	t.Helper()
	offers = make(chan int, 64)
	acceptEach(t, ln, func(n int, c net.Conn) {
		var hdr [HeaderSize]byte
		for {
			if _, err := io.ReadFull(c, hdr[:]); err != nil {
				return
			}
			h, err := DecodeHeader(hdr[:])
			if err != nil || h.Type != FrameShmOffer {
				_, _ = io.Copy(io.Discard, c)
				return
			}
			if _, err := io.CopyN(io.Discard, c, int64(h.PayloadLen)); err != nil {
				return
			}
			select {
			case offers <- n:
			default:
			}
		}
	})
	return offers
}

// TestShmOfferNobodyAnswersBreaksTheConnectionAtTheOfferDeadline: a decode that accepts the
// data connection and never answers the SHM_OFFER holds the connection's writer for
// ShmOfferTimeout (plus the small file's map time), not DialTimeout (an hour here): the
// connection breaks, the room being written fails transfer_error naming the offer, and
// the next room is offered again on a new connection (the slot redialed).
func TestShmOfferNobodyAnswersBreaksTheConnectionAtTheOfferDeadline(t *testing.T) {
	l := UniformLayout(1, 4, 4096, 0, 0)
	src := openTestRegion(t, l)
	mem := NewMemNetwork()
	ln, err := mem.Listen("silent-decode")
	if err != nil {
		t.Fatal(err)
	}
	offers := silentDecode(t, ln)
	snd, err := NewSender(src, SenderConfig{Transport: KindAuto, Dialer: mem, ConnsPerPeer: 1, DialTimeout: time.Hour,
		ShmOfferTimeout: 20 * time.Millisecond, RedialMin: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer snd.Close()
	if err := snd.AddPeer("silent-decode", l); err != nil {
		t.Fatal(err)
	}
	all := SamePages(1, []Run{{0, 4}})
	send := func(k Key) chan error {
		t.Helper()
		done := make(chan error, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := snd.Send(ctx, SendRequest{Peer: "silent-decode", Key: k, Src: all, Dst: all, Done: func(err error) { done <- err }}); err != nil {
			t.Fatal(err)
		}
		return done
	}
	offered := func(want int) {
		t.Helper()
		select {
		case n := <-offers:
			if n != want {
				t.Fatalf("offer on connection %d, want %d", n, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no offer on connection %d within 10s", want)
		}
	}
	k1 := Key{Room: 1, Nonce: 1}
	done := send(k1)
	offered(0)
	if err := waitDone(t, done); ReasonOf(err) != ReasonTransferError || !errors.Is(err, ErrConnBroken) || !strings.Contains(err.Error(), "shm offer") {
		t.Fatalf("room whose offer nobody answers: %v, want transfer_error naming the shm offer", err)
	}
	k2 := Key{Room: 2, Nonce: 1}
	done = send(k2)
	offered(1)
	if err := waitDone(t, done); ReasonOf(err) != ReasonTransferError {
		t.Fatalf("second room: %v, want transfer_error", err)
	}
}

// TestShmOfferWaitGrowsWithTheFile: the offer's wait is the base plus the time decode
// needs to map the file at shmPopulateRate, so a large region is not refused by a wait
// sized for a small one.
func TestShmOfferWaitGrowsWithTheFile(t *testing.T) {
	for _, tc := range []struct {
		size int64
		want time.Duration
	}{
		{0, time.Second},
		{shmPopulateRate, 2 * time.Second},
		{40 * shmPopulateRate, 41 * time.Second}, // past what n*time.Second in int64 holds for a 10 GiB file
	} {
		if got := shmOfferWait(time.Second, tc.size); got != tc.want {
			t.Errorf("offer wait for %d bytes: %v, want %v", tc.size, got, tc.want)
		}
	}
	if _, err := NewSender(NewEmptyRegion(), SenderConfig{ShmOfferTimeout: -time.Second}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("negative ShmOfferTimeout: %v, want ErrBadConfig", err)
	}
}

// mapOffer maps o's region as decode's answer does and, with prefault, faults the whole
// mapping in as the populate worker does.
func mapOffer(b *testing.B, o ShmOffer, prefault bool) *Mapping {
	b.Helper()
	m, code, err := openShmSource(o)
	if code != ShmAccepted {
		b.Fatalf("offer refused: %v %v", code, err)
	}
	if prefault {
		if err := populateRange(m, 0, int64(len(m.mem))); err != nil {
			b.Fatal(err)
		}
	}
	return m
}

// BenchmarkShmOfferMap is decode's side of an offer of a 512 MiB region whose pages the
// engine touched, in GB/s of region. answer: open, fstat and the mapping, what the
// connection goroutine does before it answers (no MAP_POPULATE). prefault: the same plus
// the populate worker's MADV_POPULATE_READ over the whole region, what the answer waited
// for when it was mapped with MAP_POPULATE (shmPopulateRate must stay below it for a
// decoded of that build). Compare with BenchmarkMemcpyReference of the same run.
func BenchmarkShmOfferMap(b *testing.B) {
	l := UniformLayout(1, 512, 1<<20, 0, 0)
	src := openTestRegion(b, l)
	memset(src.Buffer(0), 1)
	o := NewShmOffer(src.Current())
	for _, prefault := range []bool{false, true} {
		name := "answer"
		if prefault {
			name = "prefault"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(l.Size())
			start := time.Now()
			for i := 0; i < b.N; i++ {
				m := mapOffer(b, o, prefault)
				m.Close()
			}
			b.ReportMetric(float64(b.N)*float64(l.Size())/1e9/time.Since(start).Seconds(), "GB/s")
		})
	}
}

// BenchmarkShmFirstTouchCopy is what a chunk copied before its source mapping was
// pre-faulted costs: one thread copies 256 MiB of touched prefill pages out of a fresh
// source mapping into pre-faulted destination pages, the source's page tables faulted in
// by the copy (first-touch) or by MADV_POPULATE_READ beforehand, outside the timer
// (prefaulted), in GB/s of the copy.
func BenchmarkShmFirstTouchCopy(b *testing.B) {
	l := UniformLayout(1, 256, 1<<20, 0, 0)
	src, dst := openTestRegion(b, l), openTestRegion(b, l)
	memset(src.Buffer(0), 1)
	memset(dst.Buffer(0), 2)
	o := NewShmOffer(src.Current())
	for _, prefault := range []bool{false, true} {
		name := "first-touch"
		if prefault {
			name = "prefaulted"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(l.Size())
			var copying time.Duration
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				m := mapOffer(b, o, prefault)
				b.StartTimer()
				start := time.Now()
				copy(dst.Buffer(0), m.bufs[0])
				copying += time.Since(start)
				b.StopTimer()
				m.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(b.N)*float64(l.Size())/1e9/copying.Seconds(), "GB/s")
		})
	}
}
