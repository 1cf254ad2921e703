package service

import (
	"context"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/daemon"
	"github.com/pdlink/pdlink/pkg/room"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// gateProxy forwards decode's data port on loopback; while shut it stops
// reading what prefill writes, so prefill's data writes stall once the
// socket buffers are full (its read buffer is kept small for that).
type gateProxy struct {
	ln       net.Listener
	upstream chan string // decode's bound data address, once known

	mu     sync.Mutex
	open   chan struct{} // closed while the gate is open
	conns  []net.Conn
	closed bool
	wg     sync.WaitGroup
}

func newGateProxy(t *testing.T) *gateProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gateProxy{ln: ln, upstream: make(chan string, 1), open: make(chan struct{})}
	close(g.open)
	g.wg.Add(1)
	go g.accept()
	t.Cleanup(g.close)
	return g
}

func (g *gateProxy) addr() string { return g.ln.Addr().String() }

func (g *gateProxy) gate() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open
}

// shut stops forwarding prefill's bytes; reopen resumes it.
func (g *gateProxy) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open = make(chan struct{})
}

func (g *gateProxy) reopen() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

func (g *gateProxy) track(c net.Conn) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		c.Close()
		return false
	}
	g.conns = append(g.conns, c)
	return true
}

func (g *gateProxy) accept() {
	defer g.wg.Done()
	up := <-g.upstream
	for {
		c, err := g.ln.Accept()
		if err != nil {
			return
		}
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetReadBuffer(64 << 10)
		}
		u, err := net.Dial("tcp", up)
		if err != nil || !g.track(c) || !g.track(u) {
			c.Close()
			if u != nil {
				u.Close()
			}
			continue
		}
		g.wg.Add(2)
		go func() {
			defer g.wg.Done()
			_, _ = io.Copy(c, u)
			c.Close()
		}()
		go func() {
			defer g.wg.Done()
			defer u.Close()
			buf := make([]byte, 32<<10)
			for {
				<-g.gate()
				n, err := c.Read(buf)
				if n > 0 {
					if _, werr := u.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

func (g *gateProxy) close() {
	g.mu.Lock()
	g.closed = true
	conns := g.conns
	g.mu.Unlock()
	g.ln.Close()
	select {
	case g.upstream <- "":
	default:
	}
	g.reopen()
	for _, c := range conns {
		c.Close()
	}
	g.wg.Wait()
}

// budgetPair is a pair whose data plane goes through a gateProxy, with
// prefill's in-flight budget (1 MiB) far below one room of its region
// (32 MiB): with the gate shut, a first room's pages hold the budget and a
// second room's last Send waits for admission.
type budgetPair struct {
	*pair
	gate *gateProxy
}

func startBudgetPair(t *testing.T) *budgetPair {
	t.Helper()
	g := newGateProxy(t)
	prefillHook = func(c *room.PrefillConfig) { c.Sender.MaxInflightBytes = 1 << 20 }
	dataListenHook = func(addr string) { g.upstream <- addr }
	t.Cleanup(func() { prefillHook, dataListenHook = nil, nil })
	p := startPairWith(t, func(pre, dec *daemon.Config) {
		dec.DataAdvertise = g.addr()
		for _, c := range []*daemon.Config{pre, dec} {
			c.DrainTimeout = 100 * time.Millisecond
			// The 32 MiB room costs CPU under -race on a loaded machine:
			// a slow transfer must not fail a room that is only waiting.
			c.TransferIdleTimeout = 30 * time.Second
		}
	})
	l := transfer.UniformLayout(1, 32, 1<<20, 8, 64)
	for _, reg := range []func(path string) error{
		func(path string) error {
			_, err := p.prefill.RegisterRegion(ctxT(t), &pb.PrefillServiceRegisterRegionRequest{RegionPath: path, Layout: layoutPB(l)})
			return err
		},
		func(path string) error {
			_, err := p.decode.RegisterRegion(ctxT(t), &pb.DecodeServiceRegisterRegionRequest{RegionPath: path, Layout: layoutPB(l)})
			return err
		},
	} {
		path, err := transfer.CreateRegionFile(t.TempDir(), l)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(path) })
		if err := reg(path); err != nil {
			t.Fatal(err)
		}
	}
	return &budgetPair{pair: p, gate: g}
}

// bind opens room on both sides with pages as its destination and waits
// until prefill may send.
func (p *budgetPair) bind(t *testing.T, room uint64, pages []int32) {
	t.Helper()
	openBoth(t, p.pair, room)
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: pages}}); err != nil {
		t.Fatal(err)
	}
	waitState(t, "prefill WaitingForInput", prePoll(t, p.pair, room), pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT)
}

// holdBudget binds room and sends all its 32 pages as its last Send with
// the gate shut: the budget admits them chunk by chunk, and the room's
// chunks, closing first, hold it while its writes stall. Its Send answers
// once its last chunk is admitted, so here at its own deadline, and the
// room goes on.
func (p *budgetPair) holdBudget(t *testing.T, room uint64) {
	t.Helper()
	all := make([]int32, 32)
	for i := range all {
		all[i] = int32(i)
	}
	p.bind(t, room, all)
	p.gate.shut()
	err := sendWithin(p.pair, 300*time.Millisecond, &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: all}, Last: true})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("the holder's last Send answered %v with its writes stalled, want DeadlineExceeded", err)
	}
}

func sendWithin(p *pair, d time.Duration, req *pb.SendRequest) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, err := p.prefill.Send(ctx, req)
	return err
}

// A retried last Send answers with the first call's outcome: while the
// first call's pages wait for admission a retry waits too (here until its
// own deadline), and it answers OK once they are admitted. It used to
// answer OK at once, before anything was admitted.
func TestRetriedLastSendAnswersWithTheFirstCallsOutcome(t *testing.T) {
	p := startBudgetPair(t)
	const holder, room = 61, 62
	p.holdBudget(t, holder)
	p.bind(t, room, []int32{5})
	last := &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: []int32{9}}, Last: true, AuxIndex: 1}
	if err := sendWithin(p.pair, 300*time.Millisecond, last); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("construction: the first last Send answered %v while the budget is held, want DeadlineExceeded", err)
	}
	if err := sendWithin(p.pair, 300*time.Millisecond, last); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("the retried last Send answered %v before the first call's pages were admitted, want DeadlineExceeded", err)
	}
	p.gate.reopen()
	if _, err := p.prefill.Send(ctxT(t), last); err != nil {
		t.Fatalf("the retried last Send once the budget is free: %v", err)
	}
	waitBothSuccess(t, p.pair, holder, room)
}

// The last Send's deadline passing while its pages wait for admission
// answers DeadlineExceeded and leaves the room going: it is neither failed
// nor aborted, its pages go once admitted, and Poll shows Success without
// any retry.
func TestLastSendDeadlineWhileQueuedLeavesTheRoomGoing(t *testing.T) {
	p := startBudgetPair(t)
	const holder, room = 63, 64
	p.holdBudget(t, holder)
	p.bind(t, room, []int32{5})
	last := &pb.SendRequest{RoomId: room, Pages: &pb.PageList{Indices: []int32{9}}, Last: true, AuxIndex: 1}
	if err := sendWithin(p.pair, 300*time.Millisecond, last); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("the last Send answered %v while the budget is held, want DeadlineExceeded", err)
	}
	ps, ds := pollState(t, p.pair, room)
	if ps.State != pb.RoomState_ROOM_STATE_TRANSFERRING || ds.State == pb.RoomState_ROOM_STATE_FAILED {
		t.Fatalf("after the deadline: prefill %v, decode %v; want prefill Transferring and decode not Failed", ps.State, ds.State)
	}
	p.gate.reopen()
	waitBothSuccess(t, p.pair, holder, room)
}
