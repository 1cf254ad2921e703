package conn

import (
	"context"
	"fmt"
	"sync"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
)

// DecodeConfig configures a DecodeNode.
type DecodeConfig struct {
	Config
	// DataEndpoint is the host:port of this daemon's data listener, sent
	// in REGISTER; Layouts are its region layouts.
	DataEndpoint string
	Layouts      []*pdlinkv1.RegionLayout
	// LayoutsFunc, if set, is read at every REGISTER instead of Layouts:
	// the engine registers its regions over gRPC after the daemon starts.
	LayoutsFunc func() []*pdlinkv1.RegionLayout
	// DataPlane receives the pages (required).
	DataPlane DecodeDataPlane

	openHook func() // tests: runs in Open between reading the prefill instance and opening the room
}

// DecodeNode is decoded's room owner: it keeps one Conn per prefill
// daemon (dialed on the first Open for that address, registered first,
// registered again after the prefill restarts), draws room nonces, sends
// METADATA reliably and drives the decode room table. Methods are safe for
// concurrent use.
type DecodeNode struct {
	*core
	dcfg DecodeConfig
	dp   DecodeDataPlane

	smu      sync.Mutex
	sessions map[string]*prefillSession // by bootstrap address
	byID     map[poll.PeerID]*prefillSession
	nextID   poll.PeerID
	departed map[*prefillSession]int64 // said goodbye: Conn open until then + a heartbeat bound
}

// prefillSession is the link to one prefill daemon address. Fields after
// addr are guarded by the node's smu.
type prefillSession struct {
	n           *DecodeNode
	addr        string
	conn        Conn
	id          poll.PeerID // the PeerID rooms bound to the current instance carry
	instance    string      // "" until the first frame from it
	epoch       uint64
	registered  bool
	registering bool
	lastHeard   int64
	lastHB      int64
	up          bool
	farewell    bool // acknowledged our GOODBYE
	dd          *dedupe

	cancel context.CancelFunc // stops the receive worker (its prefill said goodbye)
}

// sessTarget is a session at one PeerID: frames queued for an instance
// that restarted are cancelled by that id.
type sessTarget struct {
	s  *prefillSession
	id poll.PeerID
}

func (t sessTarget) peerID() poll.PeerID { return t.id }

func (t sessTarget) transmit(frame []byte) error { return t.s.transmit(frame) }

// currentInstance is whichever instance of the prefill daemon the session
// talks to now. A METADATA goes there: when the prefill restarts, its room
// moves to the new instance (poll.EvPeerReplaced) and the frame follows,
// even one sent while the restart was being handled.
type currentInstance struct{ s *prefillSession }

func (t currentInstance) peerID() poll.PeerID {
	t.s.n.smu.Lock()
	defer t.s.n.smu.Unlock()
	return t.s.id
}

func (t currentInstance) transmit(frame []byte) error { return t.s.transmit(frame) }

func (s *prefillSession) transmit(frame []byte) error {
	s.n.smu.Lock()
	c := s.conn
	s.n.smu.Unlock()
	if c == nil {
		return ErrClosed
	}
	return c.Send(context.Background(), frame)
}

func (n *DecodeNode) layouts() []*pdlinkv1.RegionLayout {
	if n.dcfg.LayoutsFunc != nil {
		return n.dcfg.LayoutsFunc()
	}
	return n.dcfg.Layouts
}

// NewDecodeNode returns a node; Start starts its workers.
func NewDecodeNode(cfg DecodeConfig) (*DecodeNode, error) {
	if cfg.DataPlane == nil {
		return nil, fmt.Errorf("%w: DecodeConfig needs a DataPlane", ErrBadArgument)
	}
	if err := validateEndpoint(cfg.DataEndpoint, cfg.Limits.withDefaults()); err != nil {
		return nil, fmt.Errorf("%w: DataEndpoint: %v", ErrBadArgument, err)
	}
	c, err := newCore(cfg.Config, poll.Decode)
	if err != nil {
		return nil, err
	}
	n := &DecodeNode{core: c, dcfg: cfg, dp: cfg.DataPlane, sessions: make(map[string]*prefillSession), byID: make(map[poll.PeerID]*prefillSession)}
	c.hooks = n
	return n, nil
}

// Start starts the tick worker; connections are made on demand.
func (n *DecodeNode) Start(context.Context) error {
	n.startWorkers()
	n.log.Info("decode node started", zap.String("data_endpoint", n.dcfg.DataEndpoint))
	return nil
}

// Close fails every live room with reason shutdown, tells the prefill
// daemons (one attempt each) and says goodbye (one attempt, unless
// Shutdown did), and stops the workers and connections.
func (n *DecodeNode) Close() error {
	if !n.closed.CompareAndSwap(false, true) {
		return nil
	}
	if n.started.Load() {
		_ = n.step(poll.Event{Kind: poll.EvShutdown})
		n.sayGoodbye(doneContext())
	}
	n.stop()
	return nil
}

// kill stops the node without telling anyone (tests).
func (n *DecodeNode) kill() {
	n.closed.Store(true)
	n.stop()
}

func (n *DecodeNode) stop() {
	n.stopWorkers()
	n.closeDeparted(0, true)
	n.smu.Lock()
	defer n.smu.Unlock()
	for _, s := range n.sessions {
		if s.conn != nil {
			_ = s.conn.Close()
			s.conn = nil
		}
	}
}

// session returns the session for addr, dialing it on first use.
func (n *DecodeNode) session(addr string) (*prefillSession, error) {
	n.smu.Lock()
	s := n.sessions[addr]
	if s != nil {
		n.smu.Unlock()
		return s, nil
	}
	if !n.started.Load() || n.closed.Load() {
		n.smu.Unlock()
		return nil, ErrClosedNode
	}
	conn, err := n.cfg.Transport.Dial(n.ctx, addr)
	if err != nil {
		n.smu.Unlock()
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	n.nextID++
	sctx, cancel := context.WithCancel(n.ctx)
	s = &prefillSession{n: n, addr: addr, conn: conn, cancel: cancel, id: n.nextID, lastHeard: n.now(), up: true, dd: newDedupe(n.cfg.DedupeWindow)}
	n.sessions[addr], n.byID[s.id] = s, s
	n.smu.Unlock()
	n.log.Info("prefill session opened", zap.String("addr", addr), zap.Uint32("peer", uint32(s.id)))
	n.sup.Go("session "+addr, func(context.Context) error { return s.run(sctx) })
	n.register(s)
	return s, nil
}

// run is the supervised receive worker of a session: the reconnect loop.
// A dead Conn makes it fail; the supervisor runs it again, which dials
// again (with backoff) and registers again.
func (s *prefillSession) run(ctx context.Context) error {
	n := s.n
	if ctx.Err() != nil {
		return nil // the session was closed (its prefill said goodbye)
	}
	n.smu.Lock()
	conn := s.conn
	n.smu.Unlock()
	if conn == nil {
		c, err := n.cfg.Transport.Dial(ctx, s.addr)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("redial %s: %w", s.addr, err)
		}
		n.smu.Lock()
		s.conn, s.registered, s.registering = c, false, false
		n.smu.Unlock()
		conn = c
		n.register(s)
	}
	for {
		frame, err := conn.Recv(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			n.smu.Lock()
			if s.conn == conn {
				s.conn = nil
			}
			n.smu.Unlock()
			_ = conn.Close()
			return fmt.Errorf("connection to %s: %w", s.addr, err)
		}
		n.handle(s, frame)
	}
}

// register sends REGISTER to the session's prefill unless one is already
// on its way. It is retried until acknowledged.
func (n *DecodeNode) register(s *prefillSession) {
	if n.saidGoodbye.Load() {
		return // leaving: an unknown_peer answer must not make us a peer again
	}
	n.smu.Lock()
	if s.registering {
		n.smu.Unlock()
		return
	}
	s.registering = true
	t := sessTarget{s: s, id: s.id}
	n.smu.Unlock()
	env := &pdlinkv1.Envelope{Body: &pdlinkv1.Envelope_Register{Register: &pdlinkv1.Register{
		InstanceId: n.cfg.Instance, DataEndpoint: n.dcfg.DataEndpoint, Layouts: n.layouts()}}}
	forever := int64(1) << 62
	n.sendReliable(t, env, poll.Key{}, forever, nil, func(_ poll.PeerID, a ackResult) bool {
		n.smu.Lock()
		if s.id != t.id {
			n.smu.Unlock()
			return true // the prefill restarted meanwhile; a new REGISTER is on its way
		}
		s.registering = false
		applied := a.result == pdlinkv1.AckResult_ACK_RESULT_APPLIED
		if applied {
			s.registered = true
		}
		n.smu.Unlock()
		if !applied {
			n.log.Error("prefill refused registration", zap.String("addr", s.addr), zap.String("reason", a.reason))
			return true
		}
		n.resendRegistered(t.id)
		return true
	})
}

// Open creates a room for the scheduler (OpenReceiver), bound to the
// prefill daemon at prefillAddr, expecting ranks distinct prefill ranks
// (0 means 1). It returns the nonce drawn for the room (crypto-random,
// non-zero).
func (n *DecodeNode) Open(room poll.RoomID, prefillAddr string, ranks int) (poll.Nonce, error) {
	if n.closed.Load() {
		return 0, ErrClosedNode
	}
	if prefillAddr == "" || ranks < 0 || ranks > poll.MaxRanks {
		return 0, fmt.Errorf("%w: address %q ranks %d", ErrBadArgument, prefillAddr, ranks)
	}
	s, err := n.session(prefillAddr)
	if err != nil {
		return 0, err
	}
	n.smu.Lock()
	id := s.id
	n.smu.Unlock()
	nonce := poll.Nonce(randomUint64())
	if n.dcfg.openHook != nil {
		n.dcfg.openHook()
	}
	if err := n.step(poll.Event{Kind: poll.EvOpen, Key: poll.Key{Room: room, Nonce: nonce}, Peer: id, Ranks: uint8(max(ranks, 1))}); err != nil {
		return 0, err
	}
	n.smu.Lock()
	current := s.id
	n.smu.Unlock()
	if current != id {
		// The prefill restarted between reading its id and the open, and
		// its rooms were moved before this one existed: move it too.
		_ = n.step(poll.Event{Kind: poll.EvPeerReplaced, Peer: id, NewPeer: current})
	}
	return nonce, nil
}

// MetadataRequest is one rank's destination for SendMetadata.
type MetadataRequest struct {
	// Rank is the decode rank (Size 0 means 0 of 1).
	Rank Rank
	// DstPages must be valid for the region (the daemon's edge checked it
	// against the region and package pagelist's bounds); it is not checked
	// again here, and the peer refuses a frame whose list is malformed.
	DstPages *pdlinkv1.PageList
	AuxIndex uint32
}
