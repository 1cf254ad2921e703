package room

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

// Test timing: everything in virtual time on a FakeClock.
const (
	tTick      = 10 * time.Millisecond
	tHeartbeat = 100 * time.Millisecond
	tMisses    = 3
	tBoot      = 2 * time.Second
	tWait      = 2 * time.Second
	tIdle      = 2 * time.Second
	tLinger    = 20 * time.Second
	// tBound bounds any room's life in these tests: the longest chain of
	// deadlines plus slack for ticks and retransmits.
	tBound = tBoot + tWait + tIdle + time.Second

	prefillHost = "prefill"
	decodeHost  = "decode"
	prefillAddr = "mem://prefill:1"
	dataAddr    = "10.0.0.2:7000"
)

// fakeDP is the data plane twin for both sides. It records binds,
// expectations, fences and forgets, and refuses anything for a fenced key
// (Fence is sticky).
type fakeDP struct {
	mu        sync.Mutex
	binds     map[poll.Key][]Metadata
	expects   map[poll.Key][]Metadata
	fenced    map[poll.Key]bool
	forgotten map[poll.Key]bool
	peers     map[poll.Key]conn.PeerInfo
}

func newFakeDP() *fakeDP {
	return &fakeDP{binds: map[poll.Key][]Metadata{}, expects: map[poll.Key][]Metadata{}, fenced: map[poll.Key]bool{}, forgotten: map[poll.Key]bool{}, peers: map[poll.Key]conn.PeerInfo{}}
}

func (d *fakeDP) Bind(p conn.PeerInfo, md Metadata) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.fenced[md.Key] {
		d.binds[md.Key] = append(d.binds[md.Key], md)
		d.peers[md.Key] = p
	}
}

func (d *fakeDP) Expect(md Metadata) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fenced[md.Key] {
		return conn.ErrBadArgument
	}
	d.expects[md.Key] = append(d.expects[md.Key], md)
	return nil
}

func (d *fakeDP) Fence(k poll.Key) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.fenced[k] = true
	return true
}

func (d *fakeDP) Forget(k poll.Key) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.forgotten[k] = true
}

func (d *fakeDP) isFenced(k poll.Key) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.fenced[k]
}

func (d *fakeDP) bound(k poll.Key) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.binds[k]) > 0
}

// harness is a prefill node and a decode node over a MemNetwork with a
// FakeClock.
type harness struct {
	t     testing.TB
	clk   *conn.FakeClock
	net   *conn.MemNetwork
	pre   *PrefillOwner
	dec   *DecodeOwner
	preDP *fakeDP
	decDP *fakeDP
	gen   int
	opts  options
}

// options tweak the nodes a harness starts (restarts included).
type options struct {
	pre func(*PrefillConfig)
	dec func(*DecodeConfig)
}

func testConfig(clk conn.Clock, tr conn.Transport, inst string, seed uint64, side poll.Side) conn.Config {
	tab := poll.DefaultConfig(side)
	tab.BootstrapTimeout, tab.WaitingTimeout, tab.TransferIdleTimeout = tBoot, tWait, tIdle
	tab.ClearLinger, tab.TombstoneTTL = tLinger, tLinger
	return conn.Config{
		Instance: inst, Transport: tr, Clock: clk, Table: tab, Seed: seed,
		TickInterval: tTick, HeartbeatInterval: tHeartbeat, HeartbeatMisses: tMisses,
		RetryBase: 20 * time.Millisecond, RetryMax: 200 * time.Millisecond, NotifyHorizon: 5 * time.Second,
		PeerForgetAfter: time.Minute,
	}
}

func newHarness(t testing.TB, seed uint64) *harness { return newHarnessWith(t, seed, options{}) }

func newHarnessWith(t testing.TB, seed uint64, o options) *harness {
	t.Helper()
	clk := conn.NewFakeClock(time.Unix(1_700_000_000, 0))
	h := &harness{t: t, clk: clk, net: conn.NewMemNetwork(clk, seed), opts: o}
	h.startPrefill()
	h.startDecode()
	t.Cleanup(h.close)
	return h
}

func (h *harness) startPrefill() {
	h.t.Helper()
	h.gen++
	h.preDP = newFakeDP()
	cfg := testConfig(h.clk, h.net.Host(prefillHost), "prefill-"+string(rune('a'+h.gen)), uint64(h.gen)*7+1, poll.Prefill)
	pc := PrefillConfig{Config: cfg, ListenAddr: prefillAddr, DataPlane: h.preDP}
	if h.opts.pre != nil {
		h.opts.pre(&pc)
	}
	n, err := NewPrefillOwner(pc)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		h.t.Fatal(err)
	}
	h.pre = n
}

func (h *harness) startDecode() {
	h.t.Helper()
	h.gen++
	h.decDP = newFakeDP()
	cfg := testConfig(h.clk, h.net.Host(decodeHost), "decode-"+string(rune('a'+h.gen)), uint64(h.gen)*7+3, poll.Decode)
	dc := DecodeConfig{Config: cfg, DataEndpoint: dataAddr, DataPlane: h.decDP,
		Layouts: []*pdlinkv1.RegionLayout{{Rank: &pdlinkv1.Rank{TpSize: 1}, Buffers: []*pdlinkv1.BufferSpec{{Length: 4096, ItemLen: 64}}}}}
	if h.opts.dec != nil {
		h.opts.dec(&dc)
	}
	n, err := NewDecodeOwner(dc)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		h.t.Fatal(err)
	}
	h.dec = n
}

func (h *harness) close() {
	if h.dec != nil {
		_ = h.dec.Close()
	}
	if h.pre != nil {
		_ = h.pre.Close()
	}
}

// rogue dials prefill from a host that is no peer of it; send delivers
// one raw frame and lets the nodes settle. The connection closes when the
// test ends, if the test did not close it first.
func (h *harness) rogue() (evil conn.Conn, send func(b []byte)) {
	h.t.Helper()
	evil, err := h.net.Host("evil").Dial(context.Background(), prefillAddr)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = evil.Close() })
	return evil, func(b []byte) {
		h.t.Helper()
		if err := evil.Send(context.Background(), b); err != nil {
			h.t.Fatal(err)
		}
		h.settle()
	}
}

// settle waits (in real time, briefly) until no frame is queued or being
// handled and neither owner has an input queued or running (data-plane
// callbacks are events nobody waits for). A receiver that died mid-frame
// (panic) is let go after a while.
func (h *harness) settle() {
	deadline := time.Now().Add(200 * time.Millisecond)
	for !(h.net.Idle() && h.ownersIdle()) && time.Now().Before(deadline) {
		runtime.Gosched()
		time.Sleep(20 * time.Microsecond)
	}
}

// ownersIdle reports whether neither owner has an input queued or running.
func (h *harness) ownersIdle() bool {
	return (h.pre == nil || h.pre.ownerIdle()) && (h.dec == nil || h.dec.ownerIdle())
}

// advance moves virtual time by d, one tick at a time, settling the
// network after each.
func (h *harness) advance(d time.Duration) {
	h.settle()
	for el := time.Duration(0); el < d; el += tTick {
		h.clk.Advance(tTick)
		h.settle()
	}
}

// until advances tick by tick until cond holds or limit passes; it
// returns the virtual time it took.
func (h *harness) until(limit time.Duration, cond func() bool) (time.Duration, bool) {
	h.settle()
	for el := time.Duration(0); el <= limit; el += tTick {
		if cond() {
			return el, true
		}
		h.clk.Advance(tTick)
		h.settle()
	}
	return limit, cond()
}

// waitReal polls cond in real time, without moving the fake clock, until
// it holds or limit passes. Use it for work that runs on a node's own
// goroutine (a supervisor restart): moving virtual time before that work
// ran lets deadlines fire on a node that has not caught up yet.
func (h *harness) waitReal(limit time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Microsecond)
	}
	return true
}

func visible(n interface {
	Poll([]poll.RoomID, []poll.State) []poll.State
}, room poll.RoomID) poll.State {
	return n.Poll([]poll.RoomID{room}, nil)[0]
}

func (h *harness) preState(room poll.RoomID) poll.State { return visible(h.pre, room) }
func (h *harness) decState(room poll.RoomID) poll.State { return visible(h.dec, room) }

func (h *harness) bothTerminal(rooms ...poll.RoomID) bool {
	for _, r := range rooms {
		if !h.preState(r).Terminal() || !h.decState(r).Terminal() {
			return false
		}
	}
	return true
}

// open opens room on both sides and sends decode's metadata; it returns
// the room's key.
func (h *harness) open(room poll.RoomID, ranks int) poll.Key {
	h.t.Helper()
	if _, err := h.pre.Open(room, 0, 0); err != nil {
		h.t.Fatalf("prefill open %d: %v", room, err)
	}
	return h.openDecode(room, ranks)
}

func (h *harness) openDecode(room poll.RoomID, ranks int) poll.Key {
	h.t.Helper()
	nonce, err := h.dec.Open(room, prefillAddr, ranks)
	if err != nil {
		h.t.Fatalf("decode open %d: %v", room, err)
	}
	if err := h.dec.SendMetadata(room, MetadataRequest{Rank: Rank{Size: 1}, DstPages: &pdlinkv1.PageList{Indices: []int32{1, 2, 3}}, AuxIndex: 4}); err != nil {
		h.t.Fatalf("send metadata %d: %v", room, err)
	}
	return poll.Key{Room: room, Nonce: nonce}
}

// transfer plays the data plane once prefill has bound the room: the
// scheduler's Send on prefill, then every rank landing on decode (unless
// decode fenced the room: a fenced receiver writes nothing).
func (h *harness) transfer(key poll.Key, ranks int) {
	_ = h.pre.FirstSend(key.Room)
	for p := range ranks {
		if h.decDP.isFenced(key) {
			return
		}
		h.dec.OnProgress(key)
		h.dec.OnRankDone(key, p)
	}
}

// runRoom opens a room and drives it to the end when prefill binds it.
func (h *harness) waitBound(key poll.Key, limit time.Duration) bool {
	h.until(limit, func() bool { return h.preDP.bound(key) || h.bothTerminal(key.Room) })
	return h.preDP.bound(key)
}

func (h *harness) expect(room poll.RoomID, pre, dec poll.State) {
	h.t.Helper()
	if g := h.preState(room); g != pre {
		h.t.Errorf("room %d: prefill %v, want %v", room, g, pre)
	}
	if g := h.decState(room); g != dec {
		h.t.Errorf("room %d: decode %v, want %v", room, g, dec)
	}
}

func (h *harness) reason(n interface {
	Get(poll.RoomID) (poll.RoomInfo, error)
}, room poll.RoomID) (poll.Reason, poll.Reason) {
	info, err := n.Get(room)
	if err != nil {
		h.t.Fatalf("get %d: %v", room, err)
	}
	return info.Reason, info.PeerReason
}

// isFrame returns a predicate matching frames of type ft (for DropNext).
func isFrame(ft conn.FrameType) func([]byte) bool {
	return func(b []byte) bool {
		env := &pdlinkv1.Envelope{}
		if proto.Unmarshal(b, env) != nil {
			return false
		}
		got, ok := conn.FrameTypeOf(env)
		return ok && got == ft
	}
}

func (h *harness) checkInvariants() {
	h.t.Helper()
	if err := h.pre.checkInvariants(); err != nil {
		h.t.Errorf("prefill invariants: %v", err)
	}
	if err := h.dec.checkInvariants(); err != nil {
		h.t.Errorf("decode invariants: %v", err)
	}
}

// pagesOf returns a small destination page list for room i.
func pagesOf(i int) *pdlinkv1.PageList {
	return &pdlinkv1.PageList{Runs: []*pdlinkv1.PageRun{{Start: int32(i * 8), Count: 8}}}
}

// sumAuth is a toy Authenticator: the MAC is a keyed SHA-256 (as in
// pkg/conn's codec tests).
type sumAuth struct{ key byte }

func (a sumAuth) Seal(b []byte) ([]byte, error) {
	s := sha256.Sum256(append([]byte{a.key}, b...))
	return s[:], nil
}

func (a sumAuth) Verify(b, mac []byte) error {
	want, _ := a.Seal(b)
	if !bytes.Equal(want, mac) {
		return errors.New("bad mac")
	}
	return nil
}
