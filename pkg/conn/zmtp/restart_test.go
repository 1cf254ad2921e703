package zmtp

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/conn"
)

func TestDialerSurvivesListenerRestartOnSameAddress_R10(t *testing.T) {
	tr := testTransport(t, nil)
	l1, err := tr.Listen(context.Background(), "tcp://127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l1.Addr()
	c := dial(t, tr, addr)
	ping(t, l1, c, 5*time.Second)
	for i := range 3 {
		if err := l1.Close(); err != nil {
			t.Fatal(err)
		}
		l2, err := tr.Listen(context.Background(), addr)
		if err != nil {
			t.Fatalf("re-listen %d on %s: %v", i, addr, err)
		}
		began := time.Now()
		ping(t, l2, c, 5*time.Second)
		t.Logf("restart %d: frames flow again after %v", i, time.Since(began))
		l1 = l2
	}
	_ = l1.Close()
	if got := tr.Stats().Reconnects; got < 3 {
		t.Fatalf("reconnects = %d, want >= 3", got)
	}
}

func TestListenerReportsBoundPort(t *testing.T) {
	tr := testTransport(t, nil)
	l := listen(t, tr)
	if l.Addr() == "tcp://127.0.0.1:0" || l.Addr()[:len("tcp://127.0.0.1:")] != "tcp://127.0.0.1:" {
		t.Fatalf("Addr = %q, want the real port", l.Addr())
	}
}

// panicOnce makes the next socket reader of tr panic, once.
func panicOnce(tr *Transport) *atomic.Bool {
	var fired atomic.Bool
	hook := func() {
		if fired.CompareAndSwap(false, true) {
			panic("injected reader panic")
		}
	}
	tr.testHookRecv.Store(&hook)
	return &fired
}

func TestListenerRecoversFromReaderPanic_R6(t *testing.T) {
	ltr, dtr := testTransport(t, nil), testTransport(t, nil)
	l := listen(t, ltr)
	addr := l.Addr()
	c := dial(t, dtr, addr)
	fired := panicOnce(ltr)
	ping(t, l, c, 10*time.Second) // the first frame panics the reader
	if !fired.Load() || ltr.Stats().Restarts != 1 {
		t.Fatalf("fired=%v restarts=%d, want a recovered panic", fired.Load(), ltr.Stats().Restarts)
	}
	if l.Addr() != addr {
		t.Fatalf("address moved from %s to %s", addr, l.Addr())
	}
}

func TestConnRecoversFromReaderPanic_R6(t *testing.T) {
	ltr, dtr := testTransport(t, nil), testTransport(t, nil)
	l := listen(t, ltr)
	c := dial(t, dtr, l.Addr())
	ping(t, l, c, 5*time.Second)
	fired := panicOnce(dtr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Reply to anything so the Conn's reader gets a message and panics.
	route, _, err := func() (conn.Route, []byte, error) {
		if err := c.Send(ctx, []byte("trigger")); err != nil {
			return "", nil, err
		}
		return l.Recv(ctx)
	}()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Send(ctx, route, []byte("boom")); err != nil {
		t.Fatal(err)
	}
	waitCount(t, "conn restarts", func() uint64 { return dtr.Stats().Restarts }, 1)
	if !fired.Load() {
		t.Fatal("hook did not fire")
	}
	ping(t, l, c, 10*time.Second)
}

func TestSendRefusesOversizeAndClosedUse(t *testing.T) {
	tr := testTransport(t, nil)
	l := listen(t, tr)
	c := dial(t, tr, l.Addr())
	ctx := context.Background()
	big := make([]byte, conn.MaxFrameSize+1)
	if err := c.Send(ctx, big); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("conn send: %v", err)
	}
	if err := l.Send(ctx, "x", big); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("listener send: %v", err)
	}
	ping(t, l, c, 5*time.Second)
	_ = c.Close()
	_ = l.Close()
	if err := c.Send(ctx, []byte("x")); !errors.Is(err, conn.ErrClosed) {
		t.Fatalf("send on closed conn: %v", err)
	}
	if _, err := c.Recv(ctx); !errors.Is(err, conn.ErrClosed) {
		t.Fatalf("recv on closed conn: %v", err)
	}
	if _, _, err := l.Recv(ctx); !errors.Is(err, conn.ErrClosed) {
		t.Fatalf("recv on closed listener: %v", err)
	}
	if err := l.Send(ctx, "x", nil); !errors.Is(err, conn.ErrClosed) {
		t.Fatalf("send on closed listener: %v", err)
	}
}

func TestBadAddressesAreRefused(t *testing.T) {
	tr := testTransport(t, nil)
	for _, a := range []string{"ipc:///tmp/x", "127.0.0.1:1", "tcp://nohost", Scheme + "://127.0.0.1:1"} {
		if _, err := tr.Listen(context.Background(), a); !errors.Is(err, ErrBadAddress) {
			t.Errorf("Listen(%q) = %v", a, err)
		}
		if _, err := tr.Dial(context.Background(), a); !errors.Is(err, ErrBadAddress) {
			t.Errorf("Dial(%q) = %v", a, err)
		}
	}
}

func TestRecvHonoursContext(t *testing.T) {
	tr := testTransport(t, nil)
	l := listen(t, tr)
	c := dial(t, tr, l.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, err := c.Recv(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("conn recv: %v", err)
	}
	if _, _, err := l.Recv(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("listener recv: %v", err)
	}
}

// A Conn whose Listener never comes up keeps retrying and closes promptly.
func TestConnClosesPromptlyWhileReconnecting(t *testing.T) {
	tr := testTransport(t, nil)
	l := listen(t, tr)
	addr := l.Addr()
	_ = l.Close()
	c, err := tr.Dial(context.Background(), addr)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	began := time.Now()
	_ = c.Close()
	if d := time.Since(began); d > time.Second {
		t.Fatalf("Close took %v", d)
	}
}
