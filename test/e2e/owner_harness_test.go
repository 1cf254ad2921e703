package e2e

import (
	"cmp"
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/proc"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// ownerPair is a prefilld and a decoded driven one call at a time, with
// one region each (under /dev/shm, as an engine maps it).
type ownerPair struct {
	t         *testing.T
	pre, dec  *proc.Process
	prefill   pb.PrefillServiceClient
	decode    pb.DecodeServiceClient
	bootstrap string
	layout    transfer.Layout
	src, dst  *transfer.Region
	srcPath   string
	dstPath   string
}

// newOwnerPair starts both daemons (preArgs and decArgs added to the
// listeners' flags) and registers a region of layout on each.
func newOwnerPair(t *testing.T, layout transfer.Layout, preArgs, decArgs []string) *ownerPair {
	t.Helper()
	return newOwnerPairOf(t, layout, layout, preArgs, decArgs)
}

// newOwnerPairOf is newOwnerPair with prefill's region of layout and
// decode's of decLayout (rank 0 of each side's TP, when the sizes differ).
func newOwnerPairOf(t *testing.T, layout, decLayout transfer.Layout, preArgs, decArgs []string) *ownerPair {
	t.Helper()
	return newOwnerPairPlaced(t, layout, decLayout, preArgs, decArgs, pairPlacement{})
}

// pairPlacement is where an ownerPair's region files live and what decoded
// runs under; the zero value is one region directory for both and plain
// daemons.
type pairPlacement struct {
	srcDir, dstDir string
	// decWrap, given the prefill region's path, is the command (argv)
	// decoded runs under, decoded's own argv after it.
	decWrap func(srcPath string) []string
}

// newOwnerPairPlaced is newOwnerPairOf with the region files and decoded
// placed as pl says. The files exist before the daemons start, so a
// wrapper can see them.
func newOwnerPairPlaced(t *testing.T, layout, decLayout transfer.Layout, preArgs, decArgs []string, pl pairPlacement) *ownerPair {
	t.Helper()
	p := &ownerPair{t: t, layout: layout}
	if pl.srcDir == "" || pl.dstDir == "" {
		dir := regionDir(t)
		pl.srcDir, pl.dstDir = cmp.Or(pl.srcDir, dir), cmp.Or(pl.dstDir, dir)
	}
	for _, side := range []string{"prefill", "decode"} {
		l, dir := layout, pl.srcDir
		if side == "decode" {
			l, dir = decLayout, pl.dstDir
		}
		path, err := transfer.CreateRegionFile(dir, l)
		if err != nil {
			t.Fatal(err)
		}
		r, err := transfer.OpenRegion(path, l)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		if side == "prefill" {
			p.src, p.srcPath = r, path
		} else {
			p.dst, p.dstPath = r, path
		}
	}
	p.pre = startDaemon(t, "prefilld", append([]string{"--bootstrap-listen=tcp://127.0.0.1:0"}, preArgs...)...)
	p.bootstrap = p.pre.LogField("bootstrap socket bound", "addr")
	if p.bootstrap == "" {
		t.Fatalf("prefilld logged no bootstrap address:\n%s", p.pre.Logs())
	}
	var wrap []string
	if pl.decWrap != nil {
		wrap = pl.decWrap(p.srcPath)
	}
	p.dec = startDaemonUnder(t, wrap, "decoded", append([]string{"--data-listen=127.0.0.1:0"}, decArgs...)...)
	p.prefill = pb.NewPrefillServiceClient(grpcConn(t, p.pre.GRPCAddr))
	p.decode = pb.NewDecodeServiceClient(grpcConn(t, p.dec.GRPCAddr))

	p.registerPrefill()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.decode.RegisterRegion(ctx, &pb.DecodeServiceRegisterRegionRequest{RegionPath: p.dstPath, Layout: layoutProtoOf(decLayout)}); err != nil {
		t.Fatal(err)
	}
	return p
}

// registerPrefill registers the prefill region (again, after a restart).
func (p *ownerPair) registerPrefill() {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.prefill.RegisterRegion(ctx, &pb.PrefillServiceRegisterRegionRequest{RegionPath: p.srcPath, Layout: layoutProtoOf(p.layout)}); err != nil {
		p.t.Fatal(err)
	}
}

// layoutProtoOf is l as RegisterRegion takes it; the head fields and
// attention are zero in an opaque layout.
func layoutProtoOf(l transfer.Layout) *pb.RegionLayout {
	lp := &pb.RegionLayout{Rank: &pb.Rank{TpRank: uint32(l.Rank.TP), TpSize: uint32(max(l.Rank.Size, 1))}, Aux: &pb.AuxSpec{Offset: uint64(l.Aux.Offset), RowLen: uint32(l.Aux.RowLen), Rows: uint32(l.Aux.Rows)},
		Attention: pb.Attention(l.Attention)} // rankmap's values are the proto's
	for _, b := range l.Buffers {
		lp.Buffers = append(lp.Buffers, &pb.BufferSpec{Offset: uint64(b.Offset), Length: uint64(b.Length), ItemLen: uint32(b.ItemLen),
			PageTokens: uint32(b.PageTokens), TotalHeads: uint32(b.TotalHeads), RankHeads: uint32(b.RankHeads), HeadBytes: uint32(b.HeadBytes)})
	}
	return lp
}

// allPages is every page index of the layout's buffers, in order.
func (p *ownerPair) allPages() []int32 {
	n := p.layout.Buffers[0].Pages()
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(i)
	}
	return out
}

// open opens room on both sides (decode first, as a router does) and
// returns decode's nonce.
func (p *ownerPair) open(ctx context.Context, room uint64) uint64 {
	p.t.Helper()
	r, err := p.decode.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap})
	if err != nil {
		p.t.Fatalf("OpenReceiver %d: %v", room, err)
	}
	if _, err := p.prefill.OpenSender(ctx, &pb.OpenSenderRequest{RoomId: room}); err != nil {
		p.t.Fatalf("OpenSender %d: %v", room, err)
	}
	return r.GetStatus().GetNonce()
}

// bind sends decode's metadata for room (destination pages dst) and waits
// until prefill has the room in WaitingForInput: bound to decode.
func (p *ownerPair) bind(ctx context.Context, room uint64, dst []int32) {
	p.t.Helper()
	if _, err := p.decode.SendMetadata(ctx, &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: dst}, AuxIndex: 0}); err != nil {
		p.t.Fatalf("SendMetadata %d: %v", room, err)
	}
	p.waitPrefill(room, 10*time.Second, "WaitingForInput", func(s *pb.RoomStatus) bool {
		return s.GetState() == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT
	})
}

func (p *ownerPair) prefillStatus(room uint64) (*pb.RoomStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := p.prefill.Poll(ctx, &pb.PrefillServicePollRequest{RoomIds: []uint64{room}})
	if err != nil {
		return nil, err
	}
	return r.Statuses[0], nil
}

func (p *ownerPair) decodeStatus(room uint64) (*pb.RoomStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := p.decode.Poll(ctx, &pb.DecodeServicePollRequest{RoomIds: []uint64{room}})
	if err != nil {
		return nil, err
	}
	return r.Statuses[0], nil
}

// waitPrefill polls prefill's room every 2 ms until cond holds, failing
// the test after bound; it returns when cond first held.
func (p *ownerPair) waitPrefill(room uint64, bound time.Duration, what string, cond func(*pb.RoomStatus) bool) time.Time {
	p.t.Helper()
	return waitStatus(p.t, func() (*pb.RoomStatus, error) { return p.prefillStatus(room) }, bound, "prefill room "+what, cond)
}

func (p *ownerPair) waitDecode(room uint64, bound time.Duration, what string, cond func(*pb.RoomStatus) bool) time.Time {
	p.t.Helper()
	return waitStatus(p.t, func() (*pb.RoomStatus, error) { return p.decodeStatus(room) }, bound, "decode room "+what, cond)
}

func waitStatus(t *testing.T, get func() (*pb.RoomStatus, error), bound time.Duration, what string, cond func(*pb.RoomStatus) bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		st, err := get()
		if err == nil && cond(st) {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v (last %v, %v)", what, bound, st, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func isState(s pb.RoomState) func(*pb.RoomStatus) bool {
	return func(st *pb.RoomStatus) bool { return st.GetState() == s }
}

// failedOrRefusedAsFailed reports whether a call's answer names its room
// Failed: a response status FAILED, or FailedPrecondition saying Failed.
func failedOrRefusedAsFailed(st *pb.RoomStatus, err error) bool {
	if err == nil {
		return st.GetState() == pb.RoomState_ROOM_STATE_FAILED
	}
	s, _ := status.FromError(err)
	return s.Code() == codes.FailedPrecondition && strings.Contains(strings.ToLower(s.Message()), "is failed")
}

// stallListener stands in for decoded's data port (decoded advertises
// it): it accepts prefill's data connections, reads the first readFirst
// bytes of each and then nothing, so prefill's writer blocks in a write
// once the socket buffers are full. CutIdle and Cut reset connections and
// stop accepting, so prefill's redials are refused.
type stallListener struct {
	ln        net.Listener
	readFirst int64

	mu    sync.Mutex
	conns []*stalledConn
	cut   bool
	wg    sync.WaitGroup
}

type stalledConn struct {
	c    net.Conn
	full bool // took readFirst bytes: it carries a room and now stalls its writer
}

func newStallListener(t *testing.T, readFirst int64) *stallListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &stallListener{ln: ln, readFirst: readFirst}
	s.wg.Add(1)
	go s.accept()
	t.Cleanup(s.Cut)
	return s
}

func (s *stallListener) Addr() string { return s.ln.Addr().String() }

func (s *stallListener) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(64 << 10) // a small window: the writer stalls soon
		}
		sc := &stalledConn{c: c}
		s.mu.Lock()
		if s.cut {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns = append(s.conns, sc)
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			n, _ := io.CopyN(io.Discard, c, s.readFirst)
			s.mu.Lock()
			sc.full = n == s.readFirst
			s.mu.Unlock()
		}()
	}
}

// Stalled reports whether some connection took its readFirst bytes: a
// room's writer is now blocked on it.
func (s *stallListener) Stalled() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sc := range s.conns {
		if sc.full {
			return true
		}
	}
	return false
}

// CutIdle stops accepting and resets the connections that carry no room;
// it returns how many it reset.
func (s *stallListener) CutIdle() int {
	return s.reset(func(sc *stalledConn) bool { return !sc.full })
}

// Cut stops accepting and resets every connection (RST, so a blocked
// write fails at once); it waits for the listener's goroutines.
func (s *stallListener) Cut() {
	s.reset(func(*stalledConn) bool { return true })
	s.wg.Wait()
}

func (s *stallListener) reset(which func(*stalledConn) bool) int {
	s.mu.Lock()
	s.cut = true
	var cut []net.Conn
	kept := s.conns[:0]
	for _, sc := range s.conns {
		if which(sc) {
			cut = append(cut, sc.c)
		} else {
			kept = append(kept, sc)
		}
	}
	s.conns = kept
	s.mu.Unlock()
	s.ln.Close()
	for _, c := range cut {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		c.Close()
	}
	return len(cut)
}
