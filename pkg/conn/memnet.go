package conn

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// MemNetwork is the in-memory twin of the ZeroMQ transport, for protocol
// tests without sockets. Each daemon gets its own view with Host(name); a
// link is one direction between two hosts, and every fault control is per
// link: drop (probability, or the next N frames matching a predicate),
// duplicate, reorder (a random hold-back), delay, partition and heal, and
// killing a listener. Randomness comes from one seeded generator and time
// from the Clock, so a test with a FakeClock replays exactly.
//
// As with ZeroMQ, a Conn outlives its Listener: frames sent while no
// Listener is bound to the address are lost, and frames sent after a new
// Listener binds it reach the new one.
type MemNetwork struct {
	clock Clock

	mu        sync.Mutex
	rng       *rand.Rand
	listeners map[string]*memListener // by address
	conns     map[Route]*memConn
	queues    map[*memQueue]struct{}
	faults    map[linkKey]LinkFaults
	cut       map[linkKey]bool
	drops     []*dropRule
	nextRoute uint64

	delivered atomic.Uint64
	dropped   atomic.Uint64
}

type linkKey struct{ from, to string }

// LinkFaults are the random faults of one direction of a link.
type LinkFaults struct {
	Drop      float64       // probability a frame is lost
	Duplicate float64       // probability a frame is delivered twice
	Reorder   float64       // probability a frame is held back up to MaxHold
	MaxHold   time.Duration // hold-back bound for Reorder (default 50ms)
	Delay     time.Duration // fixed delay of every frame
}

type dropRule struct {
	from, to string // "" matches any host
	n        int
	match    func(frame []byte) bool
}

// NewMemNetwork returns an empty network whose randomness is seeded.
func NewMemNetwork(clock Clock, seed uint64) *MemNetwork {
	if clock == nil {
		clock = RealClock{}
	}
	return &MemNetwork{
		clock:     clock,
		rng:       rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		listeners: make(map[string]*memListener),
		conns:     make(map[Route]*memConn),
		queues:    make(map[*memQueue]struct{}),
		faults:    make(map[linkKey]LinkFaults),
		cut:       make(map[linkKey]bool),
	}
}

// Host returns the Transport of the daemon called name.
func (n *MemNetwork) Host(name string) Transport { return memHost{n: n, name: name} }

// SetFaults sets the random faults of the link from -> to ("" for any host
// on that end is not supported: name both hosts).
func (n *MemNetwork) SetFaults(from, to string, f LinkFaults) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.faults[linkKey{from, to}] = f
}

// DropNext drops the next count frames from -> to ("" matches any host)
// for which match returns true (nil matches every frame).
func (n *MemNetwork) DropNext(from, to string, count int, match func(frame []byte) bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.drops = append(n.drops, &dropRule{from: from, to: to, n: count, match: match})
}

// Partition cuts both directions between hosts a and b.
func (n *MemNetwork) Partition(a, b string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[linkKey{a, b}], n.cut[linkKey{b, a}] = true, true
}

// PartitionOneWay cuts from -> to only.
func (n *MemNetwork) PartitionOneWay(from, to string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[linkKey{from, to}] = true
}

// Heal restores both directions between a and b.
func (n *MemNetwork) Heal(a, b string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	delete(n.cut, linkKey{a, b})
	delete(n.cut, linkKey{b, a})
}

// KillListener closes the listener bound to addr as if its socket died:
// its Recv returns ErrClosed and the address is free to bind again.
func (n *MemNetwork) KillListener(addr string) bool {
	n.mu.Lock()
	l := n.listeners[addr]
	n.mu.Unlock()
	if l == nil {
		return false
	}
	_ = l.Close()
	return true
}

// Idle reports whether no frame is queued or being handled: every queue is
// empty and every receiver came back to Recv after its last frame. Frames
// held by a delay or a reorder wait on the Clock and do not count.
func (n *MemNetwork) Idle() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	for q := range n.queues {
		if !q.idle() {
			return false
		}
	}
	return true
}

// Bound reports whether a listener is bound to addr.
func (n *MemNetwork) Bound(addr string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.listeners[addr] != nil
}

// Connected reports whether the Conn a listener sees as route is open.
func (n *MemNetwork) Connected(route Route) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.conns[route] != nil
}

// RouteOf is the route a listener sees c's frames from ("" if c is not
// one of this network's Conns).
func (n *MemNetwork) RouteOf(c Conn) Route {
	if mc, ok := c.(*memConn); ok && mc.n == n {
		return mc.route
	}
	return ""
}

// Delivered and Dropped count frames since the network was made.
func (n *MemNetwork) Delivered() uint64 { return n.delivered.Load() }

// Dropped counts frames lost to faults, partitions, absent receivers and
// full queues.
func (n *MemNetwork) Dropped() uint64 { return n.dropped.Load() }

// send applies the link's faults to one frame and schedules its delivery.
func (n *MemNetwork) send(from, to string, frame []byte, deliver func([]byte) bool) {
	n.mu.Lock()
	k := linkKey{from, to}
	if n.cut[k] {
		n.mu.Unlock()
		n.dropped.Add(1)
		return
	}
	for i, r := range n.drops {
		if (r.from == "" || r.from == from) && (r.to == "" || r.to == to) && (r.match == nil || r.match(frame)) {
			if r.n--; r.n <= 0 {
				n.drops = append(n.drops[:i], n.drops[i+1:]...)
			}
			n.mu.Unlock()
			n.dropped.Add(1)
			return
		}
	}
	f := n.faults[k]
	if f.Drop > 0 && n.rng.Float64() < f.Drop {
		n.mu.Unlock()
		n.dropped.Add(1)
		return
	}
	copies := 1
	if f.Duplicate > 0 && n.rng.Float64() < f.Duplicate {
		copies = 2
	}
	delays := make([]time.Duration, copies)
	for i := range delays {
		delays[i] = f.Delay
		if f.Reorder > 0 && n.rng.Float64() < f.Reorder {
			hold := f.MaxHold
			if hold <= 0 {
				hold = 50 * time.Millisecond
			}
			delays[i] += time.Duration(n.rng.Int64N(int64(hold)) + 1)
		}
	}
	n.mu.Unlock()
	b := append([]byte(nil), frame...)
	for _, d := range delays {
		do := func() {
			if deliver(b) {
				n.delivered.Add(1)
			} else {
				n.dropped.Add(1)
			}
		}
		if d <= 0 {
			do()
		} else {
			n.clock.AfterFunc(d, do)
		}
	}
}

func (n *MemNetwork) dropQueue(q *memQueue) {
	n.mu.Lock()
	delete(n.queues, q)
	n.mu.Unlock()
}

// memHost is one daemon's view of the network.
type memHost struct {
	n    *MemNetwork
	name string
}

func (h memHost) Listen(_ context.Context, addr string) (Listener, error) {
	n := h.n
	n.mu.Lock()
	if _, ok := n.listeners[addr]; ok {
		n.mu.Unlock()
		return nil, fmt.Errorf("conn: mem listen %s: address in use", addr)
	}
	// Published with its queue in one critical section: a sender that
	// finds the listener must find it whole.
	l := &memListener{n: n, host: h.name, addr: addr, q: newMemQueue()}
	n.queues[l.q] = struct{}{}
	n.listeners[addr] = l
	n.mu.Unlock()
	return l, nil
}

func (h memHost) Dial(_ context.Context, addr string) (Conn, error) {
	n := h.n
	n.mu.Lock()
	n.nextRoute++
	c := &memConn{n: n, host: h.name, addr: addr, route: Route(fmt.Sprintf("%s#%d", h.name, n.nextRoute)), q: newMemQueue()}
	n.queues[c.q] = struct{}{}
	n.conns[c.route] = c
	n.mu.Unlock()
	return c, nil
}

type memListener struct {
	n          *MemNetwork
	host, addr string
	q          *memQueue
	closeOnce  sync.Once
}

func (l *memListener) Recv(ctx context.Context) (Route, []byte, error) {
	it, err := l.q.recv(ctx)
	return it.route, it.frame, err
}

func (l *memListener) Send(_ context.Context, route Route, frame []byte) error {
	if len(frame) > MaxFrameSize {
		return fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, len(frame))
	}
	if l.q.isClosed() {
		return ErrClosed
	}
	n := l.n
	n.mu.Lock()
	c := n.conns[route]
	n.mu.Unlock()
	if c == nil {
		n.dropped.Add(1)
		return nil
	}
	n.send(l.host, c.host, frame, func(b []byte) bool { return c.q.push(memItem{frame: b}) })
	return nil
}

func (l *memListener) Addr() string { return l.addr }

func (l *memListener) Close() error {
	l.closeOnce.Do(func() {
		n := l.n
		n.mu.Lock()
		if n.listeners[l.addr] == l {
			delete(n.listeners, l.addr)
		}
		n.mu.Unlock()
		l.q.close()
		n.dropQueue(l.q)
	})
	return nil
}

type memConn struct {
	n          *MemNetwork
	host, addr string
	route      Route
	q          *memQueue
	closeOnce  sync.Once
}

func (c *memConn) Recv(ctx context.Context) ([]byte, error) {
	it, err := c.q.recv(ctx)
	return it.frame, err
}

func (c *memConn) Send(_ context.Context, frame []byte) error {
	if len(frame) > MaxFrameSize {
		return fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, len(frame))
	}
	if c.q.isClosed() {
		return ErrClosed
	}
	n := c.n
	n.mu.Lock()
	l := n.listeners[c.addr]
	n.mu.Unlock()
	if l == nil {
		n.dropped.Add(1)
		return nil
	}
	// Delivery goes to whichever listener holds the address then.
	n.send(c.host, l.host, frame, func(b []byte) bool {
		n.mu.Lock()
		cur := n.listeners[c.addr]
		n.mu.Unlock()
		return cur != nil && cur.q.push(memItem{route: c.route, frame: b})
	})
	return nil
}

func (c *memConn) Close() error {
	c.closeOnce.Do(func() {
		n := c.n
		n.mu.Lock()
		delete(n.conns, c.route)
		n.mu.Unlock()
		c.q.close()
		n.dropQueue(c.q)
	})
	return nil
}

type memItem struct {
	route Route
	frame []byte
}

// memQueueCap bounds one receive queue; beyond it frames are dropped.
const memQueueCap = 1 << 14

// memQueue is one receiver's queue. handedOut is set while the receiver
// handles the frame Recv last returned (until it calls Recv again), so
// Idle can tell a quiet network from one whose receiver is still busy.
type memQueue struct {
	mu        sync.Mutex
	items     []memItem
	handedOut bool
	signal    chan struct{}
	closed    chan struct{}
}

func newMemQueue() *memQueue {
	return &memQueue{signal: make(chan struct{}, 1), closed: make(chan struct{})}
}

func (q *memQueue) push(it memItem) bool {
	q.mu.Lock()
	if q.isClosed() || len(q.items) >= memQueueCap {
		q.mu.Unlock()
		return false
	}
	q.items = append(q.items, it)
	q.mu.Unlock()
	select {
	case q.signal <- struct{}{}:
	default:
	}
	return true
}

func (q *memQueue) recv(ctx context.Context) (memItem, error) {
	for {
		q.mu.Lock()
		q.handedOut = false
		if q.isClosed() {
			q.items = nil
			q.mu.Unlock()
			return memItem{}, ErrClosed
		}
		if len(q.items) > 0 {
			it := q.items[0]
			q.items[0] = memItem{}
			q.items = q.items[1:]
			q.handedOut = true
			q.mu.Unlock()
			return it, nil
		}
		q.mu.Unlock()
		select {
		case <-q.signal:
		case <-q.closed:
		case <-ctx.Done():
			return memItem{}, ctx.Err()
		}
	}
}

func (q *memQueue) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) == 0 && !q.handedOut
}

func (q *memQueue) isClosed() bool {
	select {
	case <-q.closed:
		return true
	default:
		return false
	}
}

func (q *memQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.isClosed() {
		close(q.closed)
	}
}
