package transfer

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

// TestParseKindTakesEveryKindAndRefusesOthersNamingThem: the accepted values
// are exactly Kinds, and the refusal lists them, so the daemons' flag error
// grows with the registry.
func TestParseKindTakesEveryKindAndRefusesOthersNamingThem(t *testing.T) {
	for _, k := range Kinds() {
		if got, err := ParseKind(string(k)); err != nil || got != k {
			t.Errorf("ParseKind(%q) = %q, %v", k, got, err)
		}
	}
	for _, bad := range []string{"", "TCP", "rdma", "tcp "} {
		_, err := ParseKind(bad)
		if !errors.Is(err, ErrUnknownKind) {
			t.Errorf("ParseKind(%q): %v, want ErrUnknownKind", bad, err)
			continue
		}
		for _, k := range Kinds() {
			if !strings.Contains(err.Error(), string(k)) {
				t.Errorf("ParseKind(%q): %q does not list %q", bad, err, k)
			}
		}
	}
	l := UniformLayout(1, 4, 4096, 0, 0)
	r := openTestRegion(t, l)
	if _, err := NewTransport("rdma", r, SenderConfig{}); !errors.Is(err, ErrUnknownKind) {
		t.Errorf("NewTransport(rdma): %v, want ErrUnknownKind", err)
	}
	if _, err := NewSink("rdma", r, ReceiverConfig{}, nil); !errors.Is(err, ErrUnknownKind) {
		t.Errorf("NewSink(rdma): %v, want ErrUnknownKind", err)
	}
}

// TestAKindThatCannotStartReturnsANilInterface: a constructor's failure
// (here a config out of range) is a nil Transport or Sink, not an
// interface holding a nil pointer that a nil check lets through.
func TestAKindThatCannotStartReturnsANilInterface(t *testing.T) {
	r := openTestRegion(t, UniformLayout(1, 4, 4096, 0, 0))
	for _, k := range Kinds() {
		tr, err := NewTransport(k, r, SenderConfig{ConnsPerPeer: -1})
		if !errors.Is(err, ErrBadConfig) || tr != nil {
			t.Errorf("%s: NewTransport with a bad config = %#v, %v; want nil and ErrBadConfig", k, tr, err)
		}
		sink, err := NewSink(k, r, ReceiverConfig{PieceBytes: 1}, nil)
		if !errors.Is(err, ErrBadConfig) || sink != nil {
			t.Errorf("%s: NewSink with a bad config = %#v, %v; want nil and ErrBadConfig", k, sink, err)
		}
	}
}

// TestEveryKindMovesARoomThroughTheInterfaces: for every Kind, the
// Transport and Sink the registry builds move a room's pages and aux row
// using only the interface methods the daemons call (AddPeer, Send, Expect,
// ServeConn, Fence, Close), so a kind added to the registry is exercised
// the way the daemons use it.
func TestEveryKindMovesARoomThroughTheInterfaces(t *testing.T) {
	for _, kind := range Kinds() {
		t.Run(string(kind), func(t *testing.T) {
			l := UniformLayout(2, 32, 4096, 4, 64)
			src, dst := openTestRegion(t, l), openTestRegion(t, l)
			for i := range l.Buffers {
				fill(src.Buffer(i), uint64(i+11))
			}
			ev := newEvents()
			sink, err := NewSink(kind, dst, ReceiverConfig{PieceBytes: 4096}, ev)
			if err != nil {
				t.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			accepted := make(chan struct{})
			go func() {
				defer close(accepted)
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					sink.ServeConn(c)
				}
			}()
			tr, err := NewTransport(kind, src, SenderConfig{MaxChunkBytes: 8 << 10})
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				tr.Close()
				ln.Close()
				<-accepted
				sink.Close()
			}()
			addr := ln.Addr().String()
			if err := tr.AddPeer(addr, l); err != nil {
				t.Fatal(err)
			}
			k := Key{Room: 5, Nonce: 6}
			pages := []Run{{3, 9}}
			if err := sink.Expect(Expectation{Key: k, Dst: SamePages(2, pages), AuxRow: 1}); err != nil {
				t.Fatal(err)
			}
			aux := bytes.Repeat([]byte{9}, 64)
			done := make(chan error, 1)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := tr.Send(ctx, SendRequest{Peer: addr, Key: k, Src: SamePages(2, pages), Dst: SamePages(2, pages), Aux: aux,
				Done: func(err error) { done <- err }}); err != nil {
				t.Fatal(err)
			}
			if err := waitDone(t, done); err != nil {
				t.Fatalf("transport done: %v", err)
			}
			if r := ev.wait(t, k); r != "" {
				t.Fatalf("sink outcome %q, want complete", r)
			}
			for b := range l.Buffers {
				if !bytes.Equal(dst.Pages(b, pages[0]), src.Pages(b, pages[0])) {
					t.Fatalf("buffer %d pages differ", b)
				}
			}
			if !bytes.Equal(dst.AuxRow(1), aux) {
				t.Fatal("aux row not written")
			}
			sink.Fence(k)
			tr.Fence(k)
		})
	}
}
