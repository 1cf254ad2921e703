package transfer

import (
	"bytes"
	"context"
	"net"
	"sync"
	"testing"
	"time"
	"unsafe"
)

// readCountingListener wraps the connections it accepts so a test can see where each read
// put its bytes: straight into a destination buffer, or anywhere else (the read buffering).
type readCountingListener struct {
	net.Listener
	into []byte // the destination buffer

	mu              sync.Mutex
	direct, through int64
}

func (l *readCountingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &readCountingConn{Conn: c, l: l}, nil
}

func (l *readCountingListener) counts() (direct, through int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.direct, l.through
}

type readCountingConn struct {
	net.Conn
	l *readCountingListener
}

func (c *readCountingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		lo := uintptr(unsafe.Pointer(unsafe.SliceData(c.l.into)))
		at := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
		c.l.mu.Lock()
		if at >= lo && at < lo+uintptr(len(c.l.into)) {
			c.l.direct += int64(n)
		} else {
			c.l.through += int64(n)
		}
		c.l.mu.Unlock()
	}
	return n, err
}

// A chunk whose runs are each smaller than the read buffering (here 32 one-page runs of 16
// KiB, 512 KiB in all) must still be read straight into the destination pages: only what
// the buffering already held when the payload began may be copied out of it. Reading each
// run through the buffering copied every page byte twice (22% of decoded's CPU per GB).
func TestReceiverReadsSmallRunsStraightIntoPages(t *testing.T) {
	const pageBytes = 16 << 10
	l := UniformLayout(1, 64, pageBytes, 8, 64)
	src, dst := openTestRegion(t, l), openTestRegion(t, l)
	fill(src.Buffer(0), 3)
	ev := newEvents()
	rcv, err := NewReceiver(dst, ReceiverConfig{}, ev)
	if err != nil {
		t.Fatal(err)
	}
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &readCountingListener{Listener: tcp, into: dst.Buffer(0)}
	served := make(chan struct{})
	go func() { defer close(served); rcv.Serve(ln) }()
	snd, err := NewSender(src, SenderConfig{ConnsPerPeer: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { snd.Close(); rcv.Close(); <-served })
	if err := snd.AddPeer(tcp.Addr().String(), l); err != nil {
		t.Fatal(err)
	}
	var runs []Run
	for p := int32(0); p < 64; p += 2 {
		runs = append(runs, Run{Start: p, Count: 1})
	}
	k := Key{Room: 1, Nonce: 1}
	if err := rcv.Expect(Expectation{Key: k, Dst: [][]Run{runs}, AuxRow: 0}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	aux := bytes.Repeat([]byte{9}, 64)
	if err := snd.Send(ctx, SendRequest{Peer: tcp.Addr().String(), Key: k, Src: [][]Run{runs}, Dst: [][]Run{runs}, Aux: aux,
		Done: func(err error) { done <- err }}); err != nil {
		t.Fatal(err)
	}
	if err := waitDone(t, done); err != nil {
		t.Fatalf("done: %v", err)
	}
	if r := ev.wait(t, k); r != "" {
		t.Fatalf("receiver outcome %q", r)
	}
	for _, r := range runs {
		if !bytes.Equal(dst.Pages(0, r), src.Pages(0, r)) {
			t.Fatalf("page %d differs", r.Start)
		}
	}
	payload := int64(len(runs)) * pageBytes
	direct, through := ln.counts()
	t.Logf("payload %d B: %d B read straight into pages, %d B through the buffering", payload, direct, through)
	if through > 2*readBufBytes || direct < payload-readBufBytes {
		t.Fatalf("%d of %d payload bytes went through the read buffering (at most %d may)", payload-direct, payload, readBufBytes)
	}
}
