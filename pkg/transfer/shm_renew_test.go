package transfer

import (
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
)

// frameHookDialer dials TCP and, on the connections it makes, runs hook once, just
// before the first write that starts a frame matching match: a test's cue to change the
// world between two frames of the sender's. It counts dials.
type frameHookDialer struct {
	match func(Header) bool
	hook  func()
	once  sync.Once
	dials atomic.Int32
}

func (d *frameHookDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	d.dials.Add(1)
	return &frameHookConn{Conn: c, d: d}, nil
}

type frameHookConn struct {
	net.Conn
	d *frameHookDialer
}

// Write runs the hook before a write whose bytes start with a matching header: every
// frame's first write starts with its header (net.Buffers writes a wrapped connection
// one slice at a time), and a page or aux slice that decodes as a header would need
// the magic and a valid header crc32c.
func (c *frameHookConn) Write(p []byte) (int, error) {
	if len(p) >= HeaderSize {
		if h, err := DecodeHeader(p[:HeaderSize]); err == nil && c.d.match(h) {
			c.d.once.Do(c.d.hook)
		}
	}
	return c.Conn.Write(p)
}

func isShmOffer(h Header) bool { return h.Type == FrameShmOffer }

// lastPage is where the last page of l's last buffer starts: a file cut there is short
// for prefill's layout, for the offer's size and for decode's stat of the source (which
// knows its buffers, not its aux rows), and no page a test room reads is past its end.
func lastPage(l Layout) int64 {
	b := l.Buffers[len(l.Buffers)-1]
	return b.Offset + b.Length - b.ItemLen
}

func isShmChunk(h Header) bool { return h.Type == FrameChunk && h.Flags&FlagShm != 0 }

// TestShmFileTruncatedThenRegisteredAgainIsOfferedAgain (#26 item 1): the prefill file is
// cut below its layout (at its last page: no page a room reads is past its end, so nothing
// faults and what is under test is what each side remembers) either just before the
// connection's first shm chunk (decode's stat finds it short and keeps the offer as
// gone) or just before its first offer (decode refuses it, identity). The room of that
// moment fails transfer_error (under auto a refused offer sends it by TCP instead). Then
// the engine puts the file back and registers it again (Mapping.Renew): the next room on
// the same connection is offered again, proven, copied by shm with its bytes checked,
// and the re-offer counted once. It used to stay refused or gone for the connection's
// life: every room failed under shm, and auto stayed on TCP.
func TestShmFileTruncatedThenRegisteredAgainIsOfferedAgain(t *testing.T) {
	for _, at := range []struct {
		name  string
		match func(Header) bool
	}{{"chunk", isShmChunk}, {"offer", isShmOffer}} {
		for _, kind := range []Kind{KindShm, KindAuto} {
			t.Run(at.name+"/"+string(kind), func(t *testing.T) { shmTruncatedThenRenewed(t, kind, at.name == "offer", at.match) })
		}
	}
}

func shmTruncatedThenRenewed(t *testing.T, kind Kind, atOffer bool, match func(Header) bool) {
	l := faultLayout()
	d := &frameHookDialer{match: match}
	g := shmRig(t, l, kind, kind, SenderConfig{ConnsPerPeer: 1, Dialer: d}, ReceiverConfig{})
	path := g.src.Path()
	d.hook = func() {
		if err := os.Truncate(path, lastPage(l)); err != nil {
			t.Error(err)
		}
	}
	low := SamePages(2, []Run{{0, 16}})
	k1 := Key{Room: 1, Nonce: 1}
	err := waitDone(t, g.expectSend(t, k1, low, low, nil, -1))
	switch {
	case !atOffer: // accepted, then found short at the chunk's stat
		if ReasonOf(err) != ReasonTransferError {
			t.Fatalf("room whose chunk met the short file: sender got %v, want transfer_error", err)
		}
		if r := g.ev.wait(t, k1); r != ReasonTransferError {
			t.Fatalf("room whose chunk met the short file: receiver outcome %q, want transfer_error", r)
		}
	case kind == KindShm: // refused: shm never runs over TCP
		if ReasonOf(err) != ReasonTransferError || !errors.Is(err, ErrShmRefused) {
			t.Fatalf("room offered the short file under shm: sender got %v, want transfer_error ErrShmRefused", err)
		}
	default: // refused: auto sends it by TCP
		if err != nil {
			t.Fatalf("room offered the short file under auto: %v, want Success over TCP", err)
		}
		if r := g.ev.wait(t, k1); r != "" {
			t.Fatalf("room offered the short file under auto: receiver outcome %q", r)
		}
		equalPages(t, g, low, low)
	}
	g.rcv.Fence(k1)
	before, beforeSnd := g.rcv.ShmStats(), g.snd.ShmStats()
	if atOffer && (before.Fallbacks[ShmIdentity.String()] != 1 || before.CopiedBytes != 0) {
		t.Fatalf("offer of the short file: receiver fallbacks %v, %d bytes copied; want one identity, none", before.Fallbacks, before.CopiedBytes)
	}

	// The engine puts the file back, writes new pages and registers it again.
	if err := os.Truncate(path, l.Size()); err != nil {
		t.Fatal(err)
	}
	for b := range l.Buffers {
		fill(g.src.Buffer(b), uint64(b+40))
	}
	g.src.Current().Renew()
	k2 := Key{Room: 2, Nonce: 1}
	if err := waitDone(t, g.expectSend(t, k2, low, low, nil, -1)); err != nil {
		t.Fatalf("room after the file is whole and registered again: %v", err)
	}
	if r := g.ev.wait(t, k2); r != "" {
		t.Fatalf("room after the file is whole and registered again: receiver outcome %q", r)
	}
	equalPages(t, g, low, low)
	after, afterSnd := g.rcv.ShmStats(), g.snd.ShmStats()
	if want := uint64(32 * (64 << 10)); after.CopiedBytes-before.CopiedBytes != want {
		t.Fatalf("room after the re-registration: %d bytes copied by shm, want %d (the rank stayed off the same-host path)",
			after.CopiedBytes-before.CopiedBytes, want)
	}
	if afterSnd.Reoffers != 1 || afterSnd.Accepted != beforeSnd.Accepted+1 || after.Accepted != before.Accepted+1 {
		t.Fatalf("re-offers %d, accepted sender %d -> %d, receiver %d -> %d; want one re-offer accepted on each side",
			afterSnd.Reoffers, beforeSnd.Accepted, afterSnd.Accepted, before.Accepted, after.Accepted)
	}
	if n := d.dials.Load(); n != 1 {
		t.Fatalf("%d dials: the same connection must offer again, not a new one", n)
	}
	g.rcv.Fence(k2)

	// A third room offers nothing: the renewed answer holds.
	k3 := Key{Room: 3, Nonce: 1}
	if err := waitDone(t, g.expectSend(t, k3, low, low, nil, -1)); err != nil {
		t.Fatal(err)
	}
	if s := g.snd.ShmStats(); s.Reoffers != 1 || s.Accepted != afterSnd.Accepted {
		t.Fatalf("a room after the renewed answer offered again: re-offers %d, accepted %d", s.Reoffers, s.Accepted)
	}
	g.rcv.Fence(k3)
}
