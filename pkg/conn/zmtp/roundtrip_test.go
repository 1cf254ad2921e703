package zmtp

import (
	"context"
	"fmt"
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
	// back exactly its own frames, in order.
	for range n * rounds {
		route, f, err := l.Recv(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Send(ctx, route, f); err != nil {
			t.Fatal(err)
		}
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
