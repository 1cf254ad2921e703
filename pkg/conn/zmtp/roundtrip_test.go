package zmtp

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/conn"
)

func TestRoundTripRoutesRepliesToEachDialer(t *testing.T) {
	tr := testTransport(t, nil)
	l := listen(t, tr)
	const n = 4
	conns := make([]conn.Conn, n)
	for i := range conns {
		conns[i] = dial(t, tr, l.Addr())
		ping(t, l, conns[i], 5*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	const rounds = 20
	for r := range rounds {
		for i, c := range conns {
			if err := c.Send(ctx, fmt.Appendf(nil, "%d/%d", i, r)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Reply to every frame with its own payload: each dialer must get
	// back exactly its own frames, in order. ping resends until one
	// arrives, so copies of a ping can still be queued here: they are not
	// this test's frames (answering them instead of the last real frames
	// left a dialer waiting for its last rounds under load).
	skipped := 0
	defer func() { t.Logf("skipped %d leftover pings", skipped) }()
	for answered := 0; answered < n*rounds; {
		route, f, err := l.Recv(ctx)
		if err != nil {
			t.Fatalf("after %d of %d frames: %v", answered, n*rounds, err)
		}
		if bytes.HasPrefix(f, []byte("ping-")) {
			skipped++
			continue
		}
		if err := l.Send(ctx, route, f); err != nil {
			t.Fatal(err)
		}
		answered++
	}
	for i, c := range conns {
		for r := range rounds {
			f, err := c.Recv(ctx)
			if err != nil {
				t.Fatalf("dialer %d round %d: %v", i, r, err)
			}
			if want := fmt.Sprintf("%d/%d", i, r); string(f) != want {
				t.Fatalf("dialer %d got %q, want %q", i, f, want)
			}
		}
	}
}

// Closing everything in the middle of traffic leaves no goroutine behind
// (goleak in TestMain checks zmq4's goroutines too), and nothing blocks.
func TestCloseDuringTrafficLeaksNothing(t *testing.T) {
	tr := testTransport(t, func(o *Options) { o.SendQueue, o.RecvQueue = 16, 16 })
	l, err := tr.Listen(context.Background(), "tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const n = 6
	conns := make([]conn.Conn, n)
	for i := range conns {
		conns[i], err = tr.Dial(context.Background(), l.Addr())
		if err != nil {
			t.Fatal(err)
		}
		ping(t, l, conns[i], 5*time.Second)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			for ctx.Err() == nil {
				if c.Send(ctx, make([]byte, 200)) != nil {
					return
				}
			}
		})
	}
	// Echo without reading the Conns: their queues and zmq4's fill up.
	wg.Go(func() {
		for {
			route, f, err := l.Recv(ctx)
			if err != nil {
				return
			}
			if l.Send(ctx, route, f) != nil {
				return
			}
		}
	})
	time.Sleep(200 * time.Millisecond)
	began := time.Now()
	for _, c := range conns {
		_ = c.Close()
	}
	_ = l.Close()
	if d := time.Since(began); d > 3*time.Second {
		t.Fatalf("close took %v", d)
	}
	cancel()
	wg.Wait()
}
