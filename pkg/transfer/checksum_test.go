package transfer

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// corruptingDialer dials TCP and flips one bit of the byte at stream offset at of the first
// connection it makes; later connections are clean. It counts dials.
type corruptingDialer struct {
	at    int64
	dials atomic.Int32
}

func (d *corruptingDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil || d.dials.Add(1) > 1 {
		return c, err
	}
	return &corruptConn{Conn: c, at: d.at}, nil
}

type corruptConn struct {
	net.Conn
	mu  sync.Mutex
	off int64
	at  int64
}

func (c *corruptConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if i := c.at - c.off; i >= 0 && i < int64(len(p)) {
		q := bytes.Clone(p) // never touch the source pages
		q[i] ^= 0x40
		p = q
	}
	c.off += int64(len(p))
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// TestCorruptChunkFailsOnlyItsRoom flips one payload bit of the first room's first chunk in
// flight. That room fails with "checksum" on both sides; the other rooms sent on the same
// connection complete with intact bytes, and the connection is not dropped.
func TestCorruptChunkFailsOnlyItsRoom(t *testing.T) {
	const item = 8192
	l := UniformLayout(2, 64, item, 4, 16)
	d := &corruptingDialer{at: HeaderSize + runSize + 1000} // first chunk: one run, then payload
	g := newRig(t, l, l, true, SenderConfig{ConnsPerPeer: 1, Dialer: d, MaxChunkBytes: 4 * item}, ReceiverConfig{})
	fill(g.src.Buffer(0), 3)
	fill(g.src.Buffer(1), 4)
	keys := []Key{{Room: 1, Nonce: 1}, {Room: 2, Nonce: 1}, {Room: 3, Nonce: 1}}
	runs := [][]Run{{{0, 16}}, {{16, 16}}, {{32, 16}}}
	var dones []chan error
	for i, k := range keys {
		if err := g.rcv.Expect(Expectation{Key: k, Dst: SamePages(2, runs[i]), AuxRow: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	for i, k := range keys {
		dones = append(dones, g.send(t, k, SamePages(2, runs[i]), SamePages(2, runs[i]), bytes.Repeat([]byte{byte(i)}, 16)))
	}
	if err := waitDone(t, dones[0]); !errors.Is(err, ErrChecksum) || ReasonOf(err) != ReasonChecksum {
		t.Fatalf("corrupted room: sender got %v, want checksum", err)
	}
	if r := g.ev.wait(t, keys[0]); r != ReasonChecksum {
		t.Fatalf("corrupted room: receiver reason %q, want checksum", r)
	}
	for i := 1; i < 3; i++ {
		if err := waitDone(t, dones[i]); err != nil {
			t.Fatalf("room %v on the same connection: %v", keys[i], err)
		}
		if r := g.ev.wait(t, keys[i]); r != "" {
			t.Fatalf("room %v: receiver reason %q", keys[i], r)
		}
		for b := 0; b < 2; b++ {
			if !bytes.Equal(g.dst.Pages(b, runs[i][0]), g.src.Pages(b, runs[i][0])) {
				t.Fatalf("room %v buffer %d: bytes differ", keys[i], b)
			}
		}
	}
	if n := d.dials.Load(); n != 1 {
		t.Fatalf("%d dials: the connection was dropped", n)
	}
}

// TestCorruptHeaderBreaksOnlyTheConnection flips a bit in the first chunk's header: the
// header checksum refuses it before any byte is placed, the connection is dropped, the room
// on it fails with transfer_error, and the pool redials so the next room completes.
func TestCorruptHeaderBreaksOnlyTheConnection(t *testing.T) {
	const item = 4096
	l := UniformLayout(1, 64, item, 0, 0)
	d := &corruptingDialer{at: 9} // inside the room id
	g := newRig(t, l, l, true, SenderConfig{ConnsPerPeer: 1, Dialer: d, RedialMin: 1e6}, ReceiverConfig{})
	fill(g.src.Buffer(0), 5)
	memset(g.dst.Buffer(0), 0xAA)
	k1, k2 := Key{Room: 1, Nonce: 1}, Key{Room: 2, Nonce: 1}
	for _, k := range []Key{k1, k2} {
		if err := g.rcv.Expect(Expectation{Key: k, Dst: [][]Run{{{int32(k.Room) * 10, 4}}}, AuxRow: -1}); err != nil {
			t.Fatal(err)
		}
	}
	err := waitDone(t, g.send(t, k1, [][]Run{{{10, 4}}}, [][]Run{{{10, 4}}}, nil))
	if ReasonOf(err) != ReasonTransferError {
		t.Fatalf("room on the broken connection: %v, want transfer_error", err)
	}
	if !bytes.Equal(g.dst.Buffer(0), bytes.Repeat([]byte{0xAA}, 64*item)) {
		t.Fatal("a corrupted header placed bytes")
	}
	if err := waitDone(t, g.send(t, k2, [][]Run{{{20, 4}}}, [][]Run{{{20, 4}}}, nil)); err != nil {
		t.Fatalf("room after redial: %v", err)
	}
	if s := g.rcv.Stats(); s.RejectedFrames != 1 {
		t.Fatalf("stats %+v, want one rejected frame", s)
	}
}
