package zmtp

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// gateProxy forwards TCP connections to target, but only once open is
// closed: until then a dialer's connection attempt stays in its ZMTP
// handshake.
type gateProxy struct {
	ln   net.Listener
	open chan struct{}
	wg   sync.WaitGroup
}

func newGateProxy(t *testing.T, target string) *gateProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gateProxy{ln: ln, open: make(chan struct{})}
	var conns sync.Map
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Store(c, true)
			g.wg.Add(1)
			go func() {
				defer g.wg.Done()
				<-g.open
				up, err := net.Dial("tcp", target)
				if err != nil {
					_ = c.Close()
					return
				}
				conns.Store(up, true)
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
				<-done
				_, _ = c.Close(), up.Close()
				<-done
			}()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		g.release()
		conns.Range(func(k, _ any) bool { _ = k.(net.Conn).Close(); return true })
		g.wg.Wait()
	})
	return g
}

func (g *gateProxy) release() {
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

// Frames a Conn sends while its first connection is still in its
// handshake go out, in order, once it completes. decode sends REGISTER
// and the first room's METADATA right after Dial: when frames queued
// during the connect were dropped, the METADATA (sent after the
// connection came up) reached prefill before any REGISTER and was refused
// as from an unknown peer on every fresh start.
func TestFramesSentWhileConnectingArriveInOrderOnceConnected(t *testing.T) {
	tr := testTransport(t, nil)
	l := listen(t, tr)
	g := newGateProxy(t, l.Addr()[len("tcp://"):])
	c := dial(t, tr, "tcp://"+g.ln.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const n = 8
	for i := range n {
		if err := c.Send(ctx, fmt.Appendf(nil, "frame %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	// The frames are in the send queue or held by the connect: none can
	// have left, the proxy forwards nothing yet.
	g.release()
	for i := range n {
		_, f, err := l.Recv(ctx)
		if err != nil {
			t.Fatalf("frame %d: %v (dropped %v)", i, err, tr.Stats().Dropped)
		}
		if want := fmt.Sprintf("frame %d", i); string(f) != want {
			t.Fatalf("got %q, want %q", f, want)
		}
	}
	if d := tr.Stats().Dropped[DropDisconnected]; d != 0 {
		t.Errorf("%d frames dropped as disconnected", d)
	}
}
