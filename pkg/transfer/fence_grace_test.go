package transfer

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// fenceLog records OnFenced calls.
type fenceLog struct {
	mu    sync.Mutex
	keys  []Key
	added chan struct{}
}

func newFenceLog() *fenceLog { return &fenceLog{added: make(chan struct{}, 16)} }

func (f *fenceLog) on(k Key) {
	f.mu.Lock()
	f.keys = append(f.keys, k)
	f.mu.Unlock()
	f.added <- struct{}{}
}

func (f *fenceLog) calls() []Key {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Key(nil), f.keys...)
}

// wait returns how long it took until OnFenced was called for k, failing after bound.
func (f *fenceLog) wait(t testing.TB, k Key, since time.Time, bound time.Duration) time.Duration {
	t.Helper()
	timeout := time.After(bound)
	for {
		for _, c := range f.calls() {
			if c == k {
				return time.Since(since)
			}
		}
		select {
		case <-f.added:
		case <-timeout:
			t.Fatalf("OnFenced(%v) not called within %v", k, bound)
		}
	}
}

// smallBuffers makes a socket's kernel buffers as small as the kernel allows, so a peer that
// stops reading stalls a writer after a few KiB instead of a few MiB.
func smallBuffers(_, _ string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) {
		if serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096); serr == nil {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4096)
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// silentPeer is a loopback listener whose connections are accepted and never read: a decode
// peer behind a silent link. It counts the connections accepted.
type silentPeer struct {
	ln       net.Listener
	accepted atomic.Int32
}

func newSilentPeer(t testing.TB) *silentPeer {
	t.Helper()
	ln, err := (&net.ListenConfig{Control: smallBuffers}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &silentPeer{ln: ln}
	acceptEach(t, ln, func(int, net.Conn) { p.accepted.Add(1) })
	return p
}

// acceptEach accepts connections on ln until it closes and runs serve on each, numbered
// from 0, on a goroutine of its own (a serve that returns leaves the connection open and
// unread). At the test's end it closes ln and every connection and waits for the serves.
func acceptEach(t testing.TB, ln net.Listener, serve func(n int, c net.Conn)) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				serve(n, c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// writeWatch wraps a dialer's connections and reports whether a Write is in progress.
type writeWatch struct {
	d    Dialer
	inW  atomic.Int32
	sent atomic.Int64
}

func (w *writeWatch) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := w.d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &watchedConn{Conn: c, w: w}, nil
}

type watchedConn struct {
	net.Conn
	w *writeWatch
}

func (c *watchedConn) Write(p []byte) (int, error) {
	c.w.inW.Add(1)
	defer c.w.inW.Add(-1)
	n, err := c.Conn.Write(p)
	c.w.sent.Add(int64(n))
	return n, err
}

// TestSenderFenceInterruptsAStalledWriteWithinTheGrace: the decode peer stops reading while
// a room's chunk is being written, so the write would hold the room's source pages until its
// 30 s deadline. Fence returns false at once; after FenceGrace the write is interrupted, its
// connection breaks, OnFenced reports the room within the grace plus a bound, once, and the
// slot redials.
func TestSenderFenceInterruptsAStalledWriteWithinTheGrace(t *testing.T) {
	const item, grace = 4096, 200 * time.Millisecond
	l := UniformLayout(1, 1024, item, 0, 0)
	src := openTestRegion(t, l)
	peer := newSilentPeer(t)
	fl := newFenceLog()
	w := &writeWatch{d: &net.Dialer{Control: smallBuffers}}
	snd, err := NewSender(src, SenderConfig{ConnsPerPeer: 1, Dialer: w, FenceGrace: grace, OnFenced: fl.on,
		WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute, RedialMin: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { snd.Close() })
	addr := peer.ln.Addr().String()
	if err := snd.AddPeer(addr, l); err != nil {
		t.Fatal(err)
	}
	k := Key{Room: 1, Nonce: 1}
	all := [][]Run{{{0, 1024}}} // 4 MiB in 1 MiB chunks: far more than the socket buffers hold
	done := make(chan error, 1)
	if err := snd.Send(context.Background(), SendRequest{Peer: addr, Key: k, Src: all, Dst: all,
		Done: func(err error) { done <- err }}); err != nil {
		t.Fatal(err)
	}
	// Stalled: a write is in progress and no byte moved for a while.
	var last int64 = -1
	waitFor(t, func() bool {
		n := w.sent.Load()
		stalled := w.inW.Load() > 0 && n == last
		last = n
		return stalled
	})
	start := time.Now()
	if snd.Fence(k) {
		t.Fatal("Fence reported done while a write of the room's pages was stalled")
	}
	if took := fl.wait(t, k, start, grace+3*time.Second); took < grace {
		t.Fatalf("OnFenced after %v, before the grace %v: the write was not stalled", took, grace)
	}
	if n := snd.Stats().StalledInterrupts; n != 1 {
		t.Fatalf("StalledInterrupts = %d, want 1", n)
	}
	waitFor(t, func() bool { return peer.accepted.Load() >= 2 }) // the broken connection was redialed
	snd.Close()
	if c := fl.calls(); len(c) != 1 {
		t.Fatalf("OnFenced calls %v, want exactly one", c)
	}
	select {
	case err := <-done:
		t.Fatalf("Done called for a fenced room: %v", err)
	default:
	}
}

// TestReceiverFenceInterruptsAStalledReadWithinTheGrace: a sender stops in the middle of a
// piece of a room's chunk, so the receiver's read into the room's pages would last until the
// 30 s transfer-idle deadline. Fence returns false at once; after FenceGrace the read is
// interrupted, the connection breaks (the other room with bytes on it fails transfer_error),
// OnFenced reports the room once, and no further byte lands.
func TestReceiverFenceInterruptsAStalledReadWithinTheGrace(t *testing.T) {
	const item, grace = 4096, 200 * time.Millisecond
	l := UniformLayout(1, 16, item, 0, 0)
	fl := newFenceLog()
	rcv, dst, ev, addr := rawReceiver(t, l, ReceiverConfig{PieceBytes: item, FenceGrace: grace, OnFenced: fl.on,
		IdleTimeout: 30 * time.Second})
	memset(dst.Buffer(0), 0xAA)
	k, other := Key{Room: 1, Nonce: 1}, Key{Room: 2, Nonce: 1}
	for _, e := range []Expectation{{Key: k, Dst: [][]Run{{{0, 8}}}, AuxRow: -1}, {Key: other, Dst: [][]Run{{{8, 8}}}, AuxRow: -1}} {
		if err := rcv.Expect(e); err != nil {
			t.Fatal(err)
		}
	}
	c := dialRaw(t, addr)
	page := bytes.Repeat([]byte{0x11}, item)
	c.write(chunkHeader(other, 0, 0, []Run{{8, 1}}, item, page))
	c.write(page)
	payload := bytes.Repeat([]byte{0x22}, 8*item)
	c.write(chunkHeader(k, 0, 0, []Run{{0, 8}}, item, payload))
	c.write(payload[:item+item/2]) // page 0 and half of page 1: the receiver waits inside page 1
	waitFor(t, func() bool { return bytes.Equal(dst.Pages(0, Run{1, 1})[:item/2], payload[:item/2]) })

	start := time.Now()
	if rcv.Fence(k) {
		t.Fatal("Fence reported done while a read into the room's pages was stalled")
	}
	if took := fl.wait(t, k, start, grace+3*time.Second); took < grace {
		t.Fatalf("OnFenced after %v, before the grace %v: the read was not stalled", took, grace)
	}
	after := bytes.Clone(dst.Buffer(0))
	if r := ev.wait(t, other); r != ReasonTransferError {
		t.Fatalf("other room on the interrupted connection: %q, want transfer_error", r)
	}
	if n := rcv.Stats().StalledInterrupts; n != 1 {
		t.Fatalf("StalledInterrupts = %d, want 1", n)
	}
	// The connection is gone: the receiver closed it.
	c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var ne net.Error
	if _, err := c.c.Read(make([]byte, 1)); err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("connection still open after the interrupt: %v", err)
	}
	if !bytes.Equal(after, dst.Buffer(0)) {
		t.Fatal("bytes landed in the room's pages after OnFenced")
	}
	if !bytes.Equal(dst.Pages(0, Run{2, 6}), bytes.Repeat([]byte{0xAA}, 6*item)) {
		t.Fatal("pages after the stalled piece are not the sentinel")
	}
	if _, ok := ev.get(k); ok {
		t.Fatal("a fenced room must not report an outcome")
	}
	if c := fl.calls(); len(c) != 1 {
		t.Fatalf("OnFenced calls %v, want exactly one", c)
	}
}

// TestFencedIsReportedOnceTheWriterLetsGo: a Fence that finds a worker in the room's pages
// returns false, and OnFenced(key) follows exactly once when that worker lets go (a repeated
// Fence meanwhile changes nothing); a Fence that returns true (a queued room, an idle room)
// is never followed by OnFenced. The grace is long, so no interrupt is involved.
func TestFencedIsReportedOnceTheWriterLetsGo(t *testing.T) {
	const item = 4096
	t.Run("sender", func(t *testing.T) {
		l := UniformLayout(1, 64, item, 0, 0)
		d := newGateDialer()
		fl := newFenceLog()
		g := newRig(t, l, l, true, SenderConfig{ConnsPerPeer: 1, Dialer: d, MaxChunkBytes: item, FenceGrace: time.Hour,
			OnFenced: fl.on}, ReceiverConfig{})
		t.Cleanup(d.lift)
		k, queued, next := Key{Room: 1, Nonce: 1}, Key{Room: 2, Nonce: 1}, Key{Room: 3, Nonce: 1}
		for _, e := range []Expectation{{Key: k, Dst: [][]Run{{{0, 32}}}, AuxRow: -1},
			{Key: queued, Dst: [][]Run{{{32, 4}}}, AuxRow: -1}, {Key: next, Dst: [][]Run{{{40, 4}}}, AuxRow: -1}} {
			g.rcv.Expect(e)
		}
		d.shut()
		done := g.send(t, k, [][]Run{{{0, 32}}}, [][]Run{{{0, 32}}}, nil)
		waitFor(t, func() bool { return d.inW.Load() > 0 }) // the writer is inside a chunk write
		queuedDone := g.send(t, queued, [][]Run{{{32, 4}}}, [][]Run{{{32, 4}}}, nil)
		if !g.snd.Fence(queued) {
			t.Fatal("Fence of a queued room reported a worker")
		}
		start := time.Now()
		for range 2 { // a repeated fence while pending changes nothing
			if g.snd.Fence(k) {
				t.Fatal("Fence reported done while the writer held the room's pages")
			}
		}
		if c := fl.calls(); len(c) != 0 {
			t.Fatalf("OnFenced %v before the writer let go", c)
		}
		d.lift()
		fl.wait(t, k, start, 5*time.Second)
		// The slot writes the next room only after it let go of k: once next is done, every
		// callback the fences above could cause has run.
		if err := waitDone(t, g.send(t, next, [][]Run{{{40, 4}}}, [][]Run{{{40, 4}}}, nil)); err != nil {
			t.Fatalf("next room: %v", err)
		}
		if c := fl.calls(); len(c) != 1 || c[0] != k {
			t.Fatalf("OnFenced calls %v, want exactly [%v]", c, k)
		}
		for _, ch := range []chan error{done, queuedDone} {
			select {
			case err := <-ch:
				t.Fatalf("Done called for a fenced room: %v", err)
			default:
			}
		}
		g.rcv.Fence(k)
	})
	t.Run("receiver", func(t *testing.T) {
		l := UniformLayout(1, 16, item, 0, 0)
		fl := newFenceLog()
		rcv, dst, _, addr := rawReceiver(t, l, ReceiverConfig{PieceBytes: item, FenceGrace: time.Hour, OnFenced: fl.on})
		memset(dst.Buffer(0), 0xAA)
		k, idle := Key{Room: 1, Nonce: 1}, Key{Room: 2, Nonce: 1}
		for _, e := range []Expectation{{Key: k, Dst: [][]Run{{{0, 4}}}, AuxRow: -1}, {Key: idle, Dst: [][]Run{{{8, 4}}}, AuxRow: -1}} {
			if err := rcv.Expect(e); err != nil {
				t.Fatal(err)
			}
		}
		c := dialRaw(t, addr)
		payload := bytes.Repeat([]byte{0x33}, 4*item)
		c.write(chunkHeader(k, 0, 0, []Run{{0, 4}}, item, payload))
		c.write(payload[:item/2]) // half of page 0: the receiver waits inside it
		waitFor(t, func() bool { return bytes.Equal(dst.Pages(0, Run{0, 1})[:item/2], payload[:item/2]) })
		if !rcv.Fence(idle) {
			t.Fatal("Fence of a room with no write in progress reported one")
		}
		start := time.Now()
		for range 2 { // a repeated fence while pending changes nothing
			if rcv.Fence(k) {
				t.Fatal("Fence reported done while a piece was landing in the room's pages")
			}
		}
		if err := rcv.Expect(Expectation{Key: k, Dst: [][]Run{{{0, 4}}}, AuxRow: -1}); !errors.Is(err, ErrDuplicateRoom) {
			t.Fatalf("Expect of a room whose fence is pending: %v, want ErrDuplicateRoom", err)
		}
		if cs := fl.calls(); len(cs) != 0 {
			t.Fatalf("OnFenced %v before the piece landed", cs)
		}
		c.write(payload[item/2:]) // ends the piece; the rest of the chunk is drained
		fl.wait(t, k, start, 5*time.Second)
		c.sync() // every frame above was handled: no later callback can come
		if cs := fl.calls(); len(cs) != 1 || cs[0] != k {
			t.Fatalf("OnFenced calls %v, want exactly [%v]", cs, k)
		}
		if !bytes.Equal(dst.Pages(0, Run{1, 3}), bytes.Repeat([]byte{0xAA}, 3*item)) {
			t.Fatal("pages after the fenced piece were written")
		}
		if err := rcv.Expect(Expectation{Key: k, Dst: [][]Run{{{0, 4}}}, AuxRow: -1}); err != nil {
			t.Fatalf("Expect after the fence let go: %v", err)
		}
	})
}

// TestSendWaitingForAdmissionReturnsFencedWhenItsRoomIsFenced: the peer's in-flight budget
// is held by a room whose writes are stalled; a Send waiting for admission returns ErrFenced
// as soon as its room is fenced, not at its context's end, and charges nothing. A fence of
// an admitted room that never started writing gives its budget back at once.
func TestSendWaitingForAdmissionReturnsFencedWhenItsRoomIsFenced(t *testing.T) {
	const item = 4096
	l := UniformLayout(1, 64, item, 0, 0)
	d := newGateDialer()
	g := newRig(t, l, l, true, SenderConfig{ConnsPerPeer: 1, Dialer: d, MaxInflightBytes: 16 * item}, ReceiverConfig{})
	t.Cleanup(d.lift)
	stalled, queued, waiting, later := Key{Room: 1, Nonce: 1}, Key{Room: 2, Nonce: 1}, Key{Room: 3, Nonce: 1}, Key{Room: 4, Nonce: 1}
	for i, k := range []Key{stalled, queued, waiting, later} {
		g.rcv.Expect(Expectation{Key: k, Dst: [][]Run{{{int32(16 * i), 8}}}, AuxRow: -1})
	}
	runs := func(k Key) [][]Run { return [][]Run{{{int32(16 * (k.Room - 1)), 8}}} }
	inflight := func() int64 {
		g.snd.mu.Lock()
		p := g.snd.peers[g.addr]
		g.snd.mu.Unlock()
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.inflight
	}
	d.shut()
	stalledDone := g.send(t, stalled, runs(stalled), runs(stalled), nil)
	waitFor(t, func() bool { return d.inW.Load() > 0 })
	g.send(t, queued, runs(queued), runs(queued), nil) // admitted: the budget is now used up

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sent := make(chan error, 1)
	go func() {
		sent <- g.snd.Send(ctx, SendRequest{Peer: g.addr, Key: waiting, Src: runs(waiting), Dst: runs(waiting),
			Done: func(err error) { t.Errorf("Done called for a room that was never admitted: %v", err) }})
	}()
	waitFor(t, func() bool { // known to the sender, so waiting for admission
		g.snd.mu.Lock()
		defer g.snd.mu.Unlock()
		return g.snd.jobs[waiting] != nil
	})
	select {
	case err := <-sent:
		t.Fatalf("Send over budget returned %v before its room was fenced", err)
	default:
	}
	start := time.Now()
	if !g.snd.Fence(waiting) {
		t.Fatal("Fence of a room waiting for admission reported a worker")
	}
	select {
	case err := <-sent:
		if !errors.Is(err, ErrFenced) || ReasonOf(err) != ReasonFenced {
			t.Fatalf("Send of a fenced room waiting for admission: %v, want ErrFenced with reason fenced", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Send waiting for admission did not return when its room was fenced")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Send returned %v after the fence", d)
	}
	if n := inflight(); n != 16*item {
		t.Fatalf("in flight %d bytes, want %d: the fenced Send charged something", n, 16*item)
	}
	if !g.snd.Fence(queued) {
		t.Fatal("Fence of a queued room reported a worker")
	}
	if n := inflight(); n != 8*item {
		t.Fatalf("in flight %d bytes after fencing the queued room, want %d", n, 8*item)
	}
	// The freed budget admits a new room at once although the stalled one still holds its part.
	laterDone := g.send(t, later, runs(later), runs(later), nil)
	d.lift()
	for _, ch := range []chan error{stalledDone, laterDone} {
		if err := waitDone(t, ch); err != nil {
			t.Fatal(err)
		}
	}
	if n := inflight(); n != 0 {
		t.Fatalf("in flight %d bytes after every room finished", n)
	}
}

// pacedDialer's connections write in parts of at most pacedPart bytes, each only once the
// test allowed it, so a test can stop the sender (and the receiver reading it) inside a page.
type pacedDialer struct {
	mu      sync.Mutex
	cond    sync.Cond
	parts   int64 // parts written so far
	limit   int64 // parts allowed while not open
	open    bool
	waiting bool // a writer waits for permission
}

const pacedPart = 2048

func newPacedDialer() *pacedDialer {
	d := &pacedDialer{open: true}
	d.cond.L = &d.mu
	return d
}

// allow lets n more parts through, then holds writers again.
func (d *pacedDialer) allow(n int64) {
	d.mu.Lock()
	d.open, d.limit = false, d.parts+n
	d.mu.Unlock()
}

func (d *pacedDialer) release() {
	d.mu.Lock()
	d.open = true
	d.cond.Broadcast()
	d.mu.Unlock()
}

func (d *pacedDialer) held() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.waiting
}

func (d *pacedDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &pacedConn{Conn: c, d: d}, nil
}

type pacedConn struct {
	net.Conn
	d *pacedDialer
}

func (c *pacedConn) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		d := c.d
		d.mu.Lock()
		for !d.open && d.parts >= d.limit {
			d.waiting = true
			d.cond.Wait()
		}
		d.waiting = false
		d.parts++
		d.mu.Unlock()
		n, err := c.Conn.Write(p[:min(len(p), pacedPart)])
		written += n
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

// TestPropertyNoByteLandsAfterTheFenceIsDone fences a room that the real Sender streams at a
// random point (before its first chunk, inside a page, between chunks, after it completed),
// from a goroutine other than the receiver's, so the fence often finds a piece landing. From
// the moment the fence is done (Fence returned true, or OnFenced ran) not one byte changes in
// the destination region, although the rest of the room's chunks and its DONE still arrive.
func TestPropertyNoByteLandsAfterTheFenceIsDone(t *testing.T) {
	const item, pages = 4096, 64
	l := UniformLayout(1, pages, item, 1, 16)
	var mu sync.Mutex // guards atFence, written on the receiver's connection goroutine
	var atFence []byte
	var g *rig
	onFenced := func(Key) {
		mu.Lock()
		atFence = snapshot(g.dst)
		mu.Unlock()
	}
	d := newPacedDialer()
	g = newRig(t, l, l, true, SenderConfig{ConnsPerPeer: 1, MaxChunkBytes: 4 * item, Dialer: d},
		ReceiverConfig{PieceBytes: item, OnFenced: onFenced, FenceGrace: time.Minute})
	t.Cleanup(d.release)
	fill(g.src.Buffer(0), 5)
	var room uint64
	var pending int
	rapid.Check(t, func(rt *rapid.T) {
		room++
		k := Key{Room: room, Nonce: 1}
		memset(g.dst.Buffer(0), 0xAA)
		memset(g.dst.AuxRow(0), 0xAA)
		mu.Lock()
		atFence = nil
		mu.Unlock()
		n := rapid.IntRange(1, pages).Draw(rt, "pages")
		runs := [][]Run{{{0, int32(n)}}}
		if err := g.rcv.Expect(Expectation{Key: k, Dst: runs, AuxRow: 0}); err != nil {
			rt.Fatal(err)
		}
		// Each chunk is a header part and up to 8 page halves; allow a random prefix of it.
		d.allow(rapid.Int64Range(0, int64(n*item/pacedPart+n/4+2)).Draw(rt, "parts_before_fence"))
		done := g.send(t, k, runs, runs, bytes.Repeat([]byte{1}, 16))
		waitFor(t, func() bool {
			_, over := g.ev.get(k)
			return over || d.held()
		})
		if g.rcv.Fence(k) {
			mu.Lock()
			atFence = snapshot(g.dst)
			mu.Unlock()
		} else {
			pending++
		}
		d.release()
		err := waitDone(t, done) // every frame of the room was handled by the receiver
		if err != nil && ReasonOf(err) != ReasonFenced {
			rt.Fatalf("sender outcome %v, want success or fenced", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if atFence == nil {
			rt.Fatal("fence neither done nor reported by OnFenced")
		}
		if !bytes.Equal(atFence, snapshot(g.dst)) {
			rt.Fatal("bytes landed in the region after the fence was done")
		}
	})
	t.Logf("%d of %d fences found a piece landing", pending, room)
}

// TestNegativeFenceGraceIsRefused: a fence must be able to end, so FenceGrace is positive
// (zero takes the default).
func TestNegativeFenceGraceIsRefused(t *testing.T) {
	l := UniformLayout(1, 1, 4096, 0, 0)
	r := openTestRegion(t, l)
	if _, err := NewSender(r, SenderConfig{FenceGrace: -time.Second}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("sender: %v, want ErrBadConfig", err)
	}
	if _, err := NewReceiver(r, ReceiverConfig{FenceGrace: -time.Second}, nil); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("receiver: %v, want ErrBadConfig", err)
	}
	s, err := NewSender(r, SenderConfig{})
	if err != nil || s.cfg.FenceGrace != 500*time.Millisecond {
		t.Fatalf("sender default grace %v (%v), want 500ms", s.cfg.FenceGrace, err)
	}
	rc, err := NewReceiver(r, ReceiverConfig{}, nil)
	if err != nil || rc.cfg.FenceGrace != 500*time.Millisecond {
		t.Fatalf("receiver default grace %v (%v), want 500ms", rc.cfg.FenceGrace, err)
	}
}
