package conn

import (
	"context"
	"errors"
	"testing"
	"time"
)

func recvN(t *testing.T, ln Listener, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var got []string
	for range n {
		_, b, err := ln.Recv(ctx)
		if err != nil {
			t.Fatalf("after %v: %v", got, err)
		}
		got = append(got, string(b))
	}
	return got
}

func TestMemNetworkFaultControls(t *testing.T) {
	clk := NewFakeClock(time.Unix(0, 0))
	net := NewMemNetwork(clk, 1)
	ctx := context.Background()
	ln, _ := net.Host("p").Listen(ctx, "mem://p")
	c, _ := net.Host("d").Dial(ctx, "mem://p")
	defer c.Close()

	net.DropNext("d", "p", 2, func(b []byte) bool { return b[0] == 'x' })
	for _, s := range []string{"x1", "a", "x2", "x3"} {
		_ = c.Send(ctx, []byte(s))
	}
	if got := recvN(t, ln, 2); got[0] != "a" || got[1] != "x3" {
		t.Fatalf("drop-next: got %v", got)
	}

	net.Partition("p", "d")
	_ = c.Send(ctx, []byte("lost"))
	net.Heal("p", "d")
	_ = c.Send(ctx, []byte("after"))
	if got := recvN(t, ln, 1); got[0] != "after" {
		t.Fatalf("partition: got %v", got)
	}

	net.SetFaults("d", "p", LinkFaults{Duplicate: 1})
	_ = c.Send(ctx, []byte("twice"))
	if got := recvN(t, ln, 2); got[1] != "twice" {
		t.Fatalf("duplicate: got %v", got)
	}

	net.SetFaults("d", "p", LinkFaults{Delay: 30 * time.Millisecond})
	_ = c.Send(ctx, []byte("late"))
	clk.Advance(30 * time.Millisecond)
	if got := recvN(t, ln, 1); got[0] != "late" {
		t.Fatalf("delay: got %v", got)
	}
	net.SetFaults("d", "p", LinkFaults{})

	if err := c.Send(ctx, make([]byte, MaxFrameSize+1)); !errors.Is(err, ErrFrameTooLarge) {
		t.Fatalf("oversize send: %v", err)
	}

	// A killed listener's Recv ends; the Conn reaches the next listener at
	// the address, as with ZeroMQ.
	net.KillListener("mem://p")
	if _, _, err := ln.Recv(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("recv on killed listener: %v", err)
	}
	ln2, err := net.Host("p").Listen(ctx, "mem://p")
	if err != nil {
		t.Fatal(err)
	}
	defer ln2.Close()
	_ = c.Send(ctx, []byte("new"))
	if got := recvN(t, ln2, 1); got[0] != "new" {
		t.Fatalf("restarted listener: got %v", got)
	}
	if net.Dropped() < 3 { // x1, x2 and the partitioned frame
		t.Fatalf("dropped %d", net.Dropped())
	}
}

// Idle tracks a frame until its receiver comes back to Recv.
func TestMemNetworkIdleCoversFrameBeingHandled(t *testing.T) {
	net := NewMemNetwork(nil, 1)
	ctx := context.Background()
	ln, _ := net.Host("p").Listen(ctx, "a")
	defer ln.Close()
	c, _ := net.Host("d").Dial(ctx, "a")
	defer c.Close()
	_ = c.Send(ctx, []byte("f"))
	if net.Idle() {
		t.Fatal("idle with a queued frame")
	}
	_, _, _ = ln.Recv(ctx)
	if net.Idle() {
		t.Fatal("idle while the frame is being handled")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, _, _ = ln.Recv(cctx)
	if !net.Idle() {
		t.Fatal("not idle after the receiver came back")
	}
}

// A frame sent while the listener is being bound either waits for it or is
// dropped; it never finds a listener published without its queue (a nil
// pointer in the supervisor's R6 test, and a data race under -race).
func TestMemNetworkListenPublishesAReadyListener(t *testing.T) {
	clk := NewFakeClock(time.Unix(0, 0))
	net := NewMemNetwork(clk, 1)
	ctx := context.Background()
	c, _ := net.Host("d").Dial(ctx, "mem://p")
	defer c.Close()
	for range 200 {
		stop := make(chan struct{})
		sent := make(chan struct{})
		go func() {
			defer close(sent)
			for {
				select {
				case <-stop:
					return
				default:
					_ = c.Send(ctx, []byte("x"))
				}
			}
		}()
		ln, err := net.Host("p").Listen(ctx, "mem://p")
		close(stop)
		<-sent
		if err != nil {
			t.Fatal(err)
		}
		_ = ln.Close()
	}
}
