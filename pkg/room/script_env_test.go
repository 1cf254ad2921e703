package room

import (
	"context"
	"fmt"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// The scripted two-node environment (script_test.go runs the scripts). A
// PrefillOwner and a DecodeOwner talk over a MemNetwork on a FakeClock, but
// every frame either sends is first queued here, per direction, so a
// script decides when it is delivered, dropped or held. The trace stays
// deterministic because only one goroutine acts at a time: the harness
// releases one frame and waits until the receiver is back in Recv before
// the next, runs scheduler calls one by one, and moves time only when the
// network is quiet. A fence the script holds blocks no goroutine: the
// data plane answers "not done" and reports Fenced when the script
// releases it; only an Abort call parks until then (accounted for in
// quiet).

// scriptSide names a node.
type scriptSide int

const (
	sidePrefill scriptSide = iota
	sideDecode
)

func (s scriptSide) String() string { return [...]string{"prefill", "decode"}[s] }

func parseSide(s string) (scriptSide, error) {
	switch s {
	case "prefill":
		return sidePrefill, nil
	case "decode":
		return sideDecode, nil
	}
	return 0, fmt.Errorf("side %q: want prefill or decode", s)
}

// scriptCall is a scheduler or data-plane call run on its own goroutine,
// so a call parked until a held fence is done shows up as parked instead
// of hanging the script.
type scriptCall struct {
	desc     string
	returned bool
	blocked  bool
	// seq orders the answers of waiting calls that return in the same
	// batch (see returned): they are woken together, and which goroutine
	// gets the lock first is the scheduler's.
	seq int
}

// returnedCall is the answer of a call that waited, traced once quiet.
type returnedCall struct {
	seq  int
	line string
}

// heldFence is a Fence the script holds: the data plane answered "not
// done" and reports Fenced when the script releases it.
type heldFence struct {
	key poll.Key
}

// scriptEnv is the two-node environment a script drives.
type scriptEnv struct {
	t   testing.TB
	clk *conn.FakeClock
	net *conn.MemNetwork
	pre *PrefillOwner
	dec *DecodeOwner

	alive [2]bool
	gen   [2]int
	subs  [2]*Subscription
	dps   [2]*scriptDP
	mu    sync.Mutex // guards everything below
	// preLn and decConn are the current sockets, for injected frames.
	preLn   *heldListener
	decConn *heldConn
	out     []string
	queues  [2][]*heldFrame
	modes   [2]linkMode
	armed   [2][]*armedDrop
	pending [2]int // calls on a side that have not returned
	holdAll [2]bool
	hold    [2]map[poll.RoomID]bool
	held    [2][]*heldFence
	nonces  map[poll.Nonce]string
	byLabel map[string]poll.Nonce
	drawn   int             // labels given to nonces decode drew
	seen    map[string]bool // sender/epoch/seq of frames released once
	hbSent  [2]int          // heartbeats released in the current command
	hbLost  [2]int
	traceHB bool
	injects uint64
	drains  [2]*scriptDrain
	panics  [2]map[string]int // armed data-plane panics by "call/room"

	// transportDP runs prefill's own data plane (PrefillData) over tr,
	// the script's fake transport, on region (dataplane transport on
	// prefill); deadlines are the callers' contexts not yet ended.
	transportDP bool
	region      region
	tr          *scriptTransport
	deadlines   []*scriptDeadlineCtx
	calls       int            // waiting calls started, for their seq
	returned    []returnedCall // answers of waiting calls not yet traced
}

const (
	// quietLimit bounds (in real time) the wait for the nodes to be idle;
	// past it the script fails with what was still busy.
	quietLimit = 10 * time.Second
	// maxReleases bounds one flush: frames that answer frames forever
	// would otherwise loop.
	maxReleases = 10000
)

// newScriptEnvWith starts both nodes; with transportDP, prefill runs its
// own data plane over the script's fake transport.
func newScriptEnvWith(t testing.TB, transportDP bool) *scriptEnv {
	clk := conn.NewFakeClock(time.Unix(1_700_000_000, 0))
	e := &scriptEnv{
		t: t, clk: clk, net: conn.NewMemNetwork(clk, 1),
		hold:        [2]map[poll.RoomID]bool{{}, {}},
		nonces:      map[poll.Nonce]string{},
		byLabel:     map[string]poll.Nonce{},
		seen:        map[string]bool{},
		transportDP: transportDP,
	}
	if transportDP {
		e.region = newRegion(t)
	}
	t.Cleanup(e.close)
	e.start(sidePrefill)
	e.start(sideDecode)
	return e
}

// start runs a new incarnation of a side's node.
func (e *scriptEnv) start(s scriptSide) {
	e.gen[s]++
	host := [...]string{prefillHost, decodeHost}[s]
	inst := fmt.Sprintf("%s-%d", s, e.gen[s])
	tr := heldTransport{e: e, inner: e.net.Host(host), side: s}
	pollSide := [...]poll.Side{poll.Prefill, poll.Decode}[s]
	cfg := testConfig(e.clk, tr, inst, uint64(e.gen[s])*7+uint64(s)*2+1, pollSide)
	dp := &scriptDP{e: e, side: s, fenced: map[poll.Key]bool{}}
	e.dps[s] = dp
	if s == sidePrefill {
		pcfg := PrefillConfig{Config: cfg, ListenAddr: prefillAddr, DataPlane: dp}
		if e.transportDP {
			tr := newScriptTransport(e)
			e.tr, pcfg.DataPlane, pcfg.RegionDirs = tr, nil, tempRegionDirs()
			pcfg.newTransport = func(transfer.RegionSet, transfer.SenderConfig) (transfer.Transport, error) { return tr, nil }
		}
		n, err := NewPrefillOwner(pcfg)
		if err != nil {
			e.t.Fatal(err)
		}
		fixJitter(n.core)
		n.core.syncTicks = true
		if err := n.Start(context.Background()); err != nil {
			e.t.Fatal(err)
		}
		if e.transportDP {
			if _, err := n.RegisterRegion(e.region.path, layoutPB(e.region.layout)); err != nil {
				e.t.Fatal(err)
			}
		}
		e.pre, e.subs[s] = n, n.Subscribe(4096)
	} else {
		layouts := []*pdlinkv1.RegionLayout{{Rank: &pdlinkv1.Rank{TpSize: 1}, Buffers: []*pdlinkv1.BufferSpec{{Length: 4096, ItemLen: 64}}}}
		if e.transportDP {
			layouts = []*pdlinkv1.RegionLayout{layoutPB(e.region.layout)}
		}
		n, err := NewDecodeOwner(DecodeConfig{Config: cfg, DataEndpoint: dataAddr, DataPlane: dp, Layouts: layouts})
		if err != nil {
			e.t.Fatal(err)
		}
		fixJitter(n.core)
		n.core.syncTicks = true
		if err := n.Start(context.Background()); err != nil {
			e.t.Fatal(err)
		}
		e.dec, e.subs[s] = n, n.Subscribe(4096)
	}
	e.alive[s] = true
	e.logf("%s started", inst)
}

// fixJitter makes every retransmit backoff the midpoint of its jitter
// range. The outbox draws jitter for the frames due in a tick in map
// order, so with two frames pending the draws (and the ticks they are
// retransmitted in) would change from run to run.
func fixJitter(c *core) { c.lk.SetJitterSource(midpointSource{}) }

// midpointSource always returns 2^63+1: Int64N(n) is then n/2 (n not a
// power of two: the product's low half is at least n, so no redraw) or 1.
type midpointSource struct{}

func (midpointSource) Uint64() uint64 { return 1<<63 | 1 }

// kill stops a side like kill -9: what it had queued is lost, and so are
// its held fences (its data plane died with it); calls parked on them
// return.
func (e *scriptEnv) kill(s scriptSide) {
	e.mu.Lock()
	e.holdAll[s], e.hold[s], e.held[s] = false, map[poll.RoomID]bool{}, nil
	e.mu.Unlock()
	if s == sidePrefill {
		e.pre.kill()
	} else {
		e.dec.kill()
	}
	e.mu.Lock()
	d := dirPD
	if s == sideDecode {
		d = dirDP
	}
	if n := len(e.queues[d]); n > 0 {
		e.appendLocked(fmt.Sprintf("%d queued %s frames lost with the process", n, d))
	}
	e.queues[d] = nil
	e.mu.Unlock()
	e.alive[s] = false
	e.subs[s].Close()
	e.settle()
	e.logf("%s-%d killed", s, e.gen[s])
}

func (e *scriptEnv) close() {
	e.stopDrains()
	if e.alive[sideDecode] {
		_ = e.dec.Close()
	}
	if e.alive[sidePrefill] {
		_ = e.pre.Close()
	}
	for _, sub := range e.subs {
		if sub != nil {
			sub.Close()
		}
	}
}

// instance is the current instance id of a side.
func (e *scriptEnv) instance(s scriptSide) string { return fmt.Sprintf("%s-%d", s, e.gen[s]) }

// logf appends a trace line (see appendLocked).
func (e *scriptEnv) logf(format string, args ...any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.appendLocked(fmt.Sprintf(format, args...))
}

// appendLocked appends a line after the transitions published so far:
// they were published by the one goroutine acting, before whatever is
// logged now, so draining first keeps the order.
func (e *scriptEnv) appendLocked(line string) {
	e.drainLocked()
	e.out = append(e.out, line)
}

func (e *scriptEnv) drainLocked() {
	for s, sub := range e.subs {
		if sub == nil {
			continue
		}
		for drained := false; !drained; {
			select {
			case tr, ok := <-sub.C():
				if ok {
					e.out = append(e.out, e.formatTransition(scriptSide(s), tr))
				} else {
					drained = true
				}
			default:
				drained = true
			}
		}
	}
}

func (e *scriptEnv) formatTransition(s scriptSide, tr Transition) string {
	line := fmt.Sprintf("%s: %s %v -> %v", s, e.keyLocked(tr.Key), tr.From, tr.To)
	if tr.Reason != "" {
		line += " reason=" + string(tr.Reason)
	}
	if tr.PeerReason != "" {
		line += " peer_reason=" + string(tr.PeerReason)
	}
	return line
}

// labelLocked names a nonce: decode draws them at random, so the trace
// shows n1, n2... in order of first appearance. Nonces a script writes
// as numbers keep their number.
func (e *scriptEnv) labelLocked(n poll.Nonce) string {
	if n == 0 {
		return "-"
	}
	if l, ok := e.nonces[n]; ok {
		return l
	}
	e.drawn++
	l := fmt.Sprintf("n%d", e.drawn)
	e.nonces[n], e.byLabel[l] = l, n
	return l
}

func (e *scriptEnv) keyLocked(k poll.Key) string {
	return fmt.Sprintf("%d/%s", k.Room, e.labelLocked(k.Nonce))
}

func (e *scriptEnv) key(k poll.Key) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.keyLocked(k)
}

// nonceArg parses a script nonce: a label (n1) or a number.
func (e *scriptEnv) nonceArg(s string) (poll.Nonce, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if n, ok := e.byLabel[s]; ok {
		return n, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("nonce %q: not a label seen so far nor a number", s)
	}
	if _, ok := e.nonces[poll.Nonce(v)]; !ok {
		e.nonces[poll.Nonce(v)], e.byLabel[s] = s, poll.Nonce(v)
	}
	return poll.Nonce(v), nil
}

// sanitize replaces random nonces in free text (error messages) by their
// labels.
func (e *scriptEnv) sanitize(s string) string {
	e.mu.Lock()
	defer e.mu.Unlock()
	for n, l := range e.nonces {
		if d := strconv.FormatUint(uint64(n), 10); d != l {
			s = strings.ReplaceAll(s, d, l)
		}
	}
	return s
}

// takeOutput returns and resets the trace of the current command.
func (e *scriptEnv) takeOutput() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.drainLocked()
	for d := range e.hbSent {
		if e.hbSent[d] > 0 || e.hbLost[d] > 0 {
			line := fmt.Sprintf("heartbeats %v: %d delivered", linkDir(d), e.hbSent[d])
			if e.hbLost[d] > 0 {
				line += fmt.Sprintf(", %d lost", e.hbLost[d])
			}
			e.out = append(e.out, line)
		}
		e.hbSent[d], e.hbLost[d] = 0, 0
	}
	out := e.out
	e.out = nil
	return out
}

// quiet reports whether nothing is in progress: every scheduler call has
// returned or is parked until its room's fence is done, neither owner has
// an input queued or running, and every receive queue is empty with its
// receiver back in Recv.
func (e *scriptEnv) quiet() bool {
	// A drain is woken by the nodes and wakes them: the nodes idle on
	// both sides of a parked drain means it did not act in between.
	return e.nodesQuiet() && e.drainsParked() && e.nodesQuiet() && e.drainsParked()
}

func (e *scriptEnv) nodesQuiet() bool {
	e.mu.Lock()
	pending := e.pending
	e.mu.Unlock()
	for s, n := range pending {
		if n > e.parkedCalls(scriptSide(s))+e.admissionParked(scriptSide(s)) {
			return false
		}
	}
	if (e.alive[sidePrefill] && !e.pre.ownerIdle()) || (e.alive[sideDecode] && !e.dec.ownerIdle()) {
		return false
	}
	return e.net.Idle()
}

// parkedCalls counts a side's calls parked until a fence is done (its
// effects performed, waiting).
func (e *scriptEnv) parkedCalls(s scriptSide) int {
	if !e.alive[s] {
		return 0
	}
	if s == sideDecode {
		return int(e.dec.parkedCalls.Load())
	}
	return int(e.pre.parkedCalls.Load())
}

// settle waits, with a bound, until quiet.
func (e *scriptEnv) settle() {
	deadline := time.Now().Add(quietLimit)
	for !e.quiet() {
		if time.Now().After(deadline) {
			e.t.Fatalf("nodes still busy after %v (pending calls %v)", quietLimit, e.pending)
		}
		runtime.Gosched()
		time.Sleep(20 * time.Microsecond)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	sort.Slice(e.returned, func(i, j int) bool { return e.returned[i].seq < e.returned[j].seq })
	for _, r := range e.returned {
		e.appendLocked(r.line)
	}
	e.returned = nil
}

// call runs fn (a node call) on its own goroutine and logs its answer. If
// the call is still running once everything else is quiet, it is parked
// until a held fence is done: that is logged, and its answer comes when
// it returns.
func (e *scriptEnv) call(s scriptSide, desc string, fn func() string) {
	e.callWaiting(s, desc, "parked until the room's fence is done", fn)
}

// callWaiting is call, tracing "<desc>: <waiting>" for a call that has
// not returned once everything else is quiet; it reports whether it had
// not.
func (e *scriptEnv) callWaiting(s scriptSide, desc, waiting string, fn func() string) bool {
	return e.startCall(s, desc, waiting, false, fn)
}

// startCall is callWaiting; with ordered, the answer of a call that
// waited is traced once the nodes are quiet again, after those of the
// calls started before it that returned in the same batch.
func (e *scriptEnv) startCall(s scriptSide, desc, waiting string, ordered bool, fn func() string) bool {
	c := &scriptCall{desc: desc}
	e.mu.Lock()
	e.pending[s]++
	e.calls++
	c.seq = e.calls
	e.mu.Unlock()
	go func() {
		ans := fn()
		e.mu.Lock()
		defer e.mu.Unlock()
		e.pending[s]--
		c.returned = true
		if c.blocked {
			ans = fmt.Sprintf("%s returned: %s", c.desc, ans)
			if ordered {
				e.returned = append(e.returned, returnedCall{seq: c.seq, line: ans})
				return
			}
		}
		e.appendLocked(ans)
	}()
	e.settle()
	e.mu.Lock()
	defer e.mu.Unlock()
	if !c.returned {
		c.blocked = true
		e.appendLocked(desc + ": " + waiting)
	}
	return c.blocked
}

// answer renders a call's result.
func (e *scriptEnv) answer(err error, ok string) string {
	if err != nil {
		return "error: " + e.sanitize(err.Error())
	}
	return ok
}

// holdFences makes a side's data plane answer Fence "not done" (room 0:
// every room) until the script releases it.
func (e *scriptEnv) holdFences(s scriptSide, room poll.RoomID) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if room == 0 {
		e.holdAll[s] = true
	} else {
		e.hold[s][room] = true
	}
}

// releaseFences stops holding a side's fences (room 0: all) and reports
// the held ones done (Fenced), oldest first, each until the nodes are
// quiet again.
func (e *scriptEnv) releaseFences(s scriptSide, room poll.RoomID) {
	e.mu.Lock()
	if room == 0 {
		e.holdAll[s] = false
		e.hold[s] = map[poll.RoomID]bool{}
	} else {
		delete(e.hold[s], room)
	}
	var release []*heldFence
	kept := e.held[s][:0]
	for _, f := range e.held[s] {
		if room == 0 || f.key.Room == room {
			release = append(release, f)
		} else {
			kept = append(kept, f)
		}
	}
	e.held[s] = kept
	e.mu.Unlock()
	for _, f := range release {
		e.logf("%s dp: fence %s released", s, e.key(f.key))
		e.dps[s].markFenced(f.key)
		if s == sidePrefill {
			e.pre.Fenced(f.key)
		} else {
			e.dec.Fenced(f.key)
		}
		e.settle()
	}
}

// scriptDP is the data-plane stand-in of one side: it logs binds,
// expectations, fences and forgets, holds fences the script holds, and
// (decode) writes nothing for a fenced room.
type scriptDP struct {
	e      *scriptEnv
	side   scriptSide
	mu     sync.Mutex
	fenced map[poll.Key]bool
}

func (d *scriptDP) Bind(p conn.PeerInfo, md Metadata) {
	d.e.maybePanic(d.side, "bind", md.Key)
	d.e.logf("%s dp: bind %s to %s pages=%s aux=%d%s", d.side, d.e.key(md.Key), p.Instance, formatPages(md.DstPages), md.AuxIndex, rankSuffix(md.Rank))
}

func (d *scriptDP) Expect(md Metadata) error {
	if d.isFenced(md.Key) {
		d.e.logf("%s dp: expect %s refused: fenced", d.side, d.e.key(md.Key))
		return conn.ErrBadArgument
	}
	d.e.logf("%s dp: expect %s pages=%s aux=%d%s", d.side, d.e.key(md.Key), formatPages(md.DstPages), md.AuxIndex, rankSuffix(md.Rank))
	return nil
}

func (d *scriptDP) Fence(k poll.Key) bool {
	e := d.e
	e.maybePanic(d.side, "fence", k)
	e.mu.Lock()
	held := e.holdAll[d.side] || e.hold[d.side][k.Room]
	if held {
		e.held[d.side] = append(e.held[d.side], &heldFence{key: k})
		e.appendLocked(fmt.Sprintf("%s dp: fence %s held", d.side, e.keyLocked(k)))
	} else {
		e.appendLocked(fmt.Sprintf("%s dp: fence %s", d.side, e.keyLocked(k)))
	}
	e.mu.Unlock()
	if held {
		return false
	}
	d.markFenced(k)
	return true
}

func (d *scriptDP) markFenced(k poll.Key) {
	d.mu.Lock()
	d.fenced[k] = true
	d.mu.Unlock()
}

func (d *scriptDP) Forget(k poll.Key) { d.e.logf("%s dp: forget %s", d.side, d.e.key(k)) }

func (d *scriptDP) isFenced(k poll.Key) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.fenced[k]
}

// roomsOf lists a node's rooms in id order.
func roomsOf(c *core) []poll.RoomInfo {
	infos, _, _ := c.List(poll.Filter{}, "", 1000)
	sort.Slice(infos, func(i, j int) bool { return infos[i].Key.Room < infos[j].Key.Room })
	return infos
}

// rankSuffix names a rank of a multi-rank room in a trace line (nothing
// for rank 0 of 1, so single-rank traces read as they always did).
func rankSuffix(r Rank) string {
	if r.Size <= 1 {
		return ""
	}
	return fmt.Sprintf(" rank=%d/%d", r.TP, r.Size)
}
