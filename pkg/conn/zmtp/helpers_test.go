package zmtp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/pdlink/pdlink/pkg/conn"
)

// testTransport returns a Transport with fast timeouts for tests.
func testTransport(t testing.TB, mod func(*Options)) *Transport {
	t.Helper()
	o := Options{
		HandshakeTimeout: time.Second,
		ReconnectMin:     10 * time.Millisecond,
		ReconnectMax:     200 * time.Millisecond,
	}
	if tt, ok := t.(*testing.T); ok {
		o.Logger = zaptest.NewLogger(tt)
	}
	if mod != nil {
		mod(&o)
	}
	return New(o)
}

func listen(t testing.TB, tr *Transport) conn.Listener {
	t.Helper()
	l, err := tr.Listen(context.Background(), "tcp://127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func dial(t testing.TB, tr *Transport, addr string) conn.Conn {
	t.Helper()
	c, err := tr.Dial(context.Background(), addr)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// ping sends frames from c until l receives one (bounded by within), then
// checks a reply reaches c. It returns the Route l saw.
func ping(t testing.TB, l conn.Listener, c conn.Conn, within time.Duration) conn.Route {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	want := fmt.Sprintf("ping-%d", time.Now().UnixNano())
	for {
		if err := c.Send(ctx, []byte(want)); err != nil {
			t.Fatalf("send: %v", err)
		}
		rctx, rcancel := context.WithTimeout(ctx, 50*time.Millisecond)
		route, got, err := l.Recv(rctx)
		rcancel()
		if err == nil && string(got) == want {
			if err := l.Send(ctx, route, []byte("pong:"+want)); err != nil {
				t.Fatalf("reply: %v", err)
			}
			for {
				f, err := c.Recv(ctx)
				if err != nil {
					t.Fatalf("no reply within %v: %v", within, err)
				}
				if string(f) == "pong:"+want {
					return route
				}
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("no frame within %v", within)
		}
	}
}

func recvWithin(l conn.Listener, d time.Duration) (conn.Route, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return l.Recv(ctx)
}
