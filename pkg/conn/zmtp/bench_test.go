package zmtp

import (
	"context"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// The benchmarks report frames/s of 200-byte frames over loopback, through
// the guard, the owner goroutines and zmq4.

// BenchmarkRoundTrip: Conn.Send -> Listener.Recv -> Listener.Send ->
// Conn.Recv, one frame in flight.
func BenchmarkRoundTrip(b *testing.B) {
	tr := testTransport(b, nil)
	l := listen(b, tr)
	c := dial(b, tr, l.Addr())
	ping(b, l, c, 5*time.Second)
	ctx := context.Background()
	frame := make([]byte, 200)
	b.ResetTimer()
	began := time.Now()
	for b.Loop() {
		if err := c.Send(ctx, frame); err != nil {
			b.Fatal(err)
		}
		route, f, err := l.Recv(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Send(ctx, route, f); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Recv(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(began).Seconds(), "roundtrips/s")
}

// BenchmarkOneWay: a Conn streams frames, the Listener receives them all.
func BenchmarkOneWay(b *testing.B) {
	tr := testTransport(b, nil)
	l := listen(b, tr)
	c := dial(b, tr, l.Addr())
	ping(b, l, c, 5*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	frame := make([]byte, 200)
	b.ResetTimer()
	began := time.Now()
	errc := make(chan error, 1)
	go func() {
		for range b.N {
			if err := c.Send(ctx, frame); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	for range b.N {
		if _, _, err := l.Recv(ctx); err != nil {
			b.Fatalf("recv: %v (dropped %v)", err, tr.Stats().Dropped)
		}
	}
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(b.N)/time.Since(began).Seconds(), "frames/s")
}

// BenchmarkRawZMQ4RoundTrip is the baseline: a plain zmq4 DEALER/ROUTER
// pair on tcp://, no guard, no owner goroutines, called directly.
func BenchmarkRawZMQ4RoundTrip(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	router := zmq4.NewRouter(ctx, zmq4.WithLogger(discard))
	defer router.Close()
	if err := router.Listen("tcp://127.0.0.1:0"); err != nil {
		b.Fatal(err)
	}
	dealer := zmq4.NewDealer(ctx, zmq4.WithLogger(discard), zmq4.WithID(zmq4.SocketIdentity("bench")))
	defer dealer.Close()
	if err := dealer.Dial("tcp://" + router.Addr().String()); err != nil {
		b.Fatal(err)
	}
	frame := make([]byte, 200)
	began := time.Now()
	for b.Loop() {
		if err := dealer.Send(zmq4.NewMsg(frame)); err != nil {
			b.Fatal(err)
		}
		msg, err := router.Recv()
		if err != nil {
			b.Fatal(err)
		}
		if err := router.Send(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := dealer.Recv(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/time.Since(began).Seconds(), "roundtrips/s")
}
