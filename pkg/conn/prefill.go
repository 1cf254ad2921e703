package conn

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
)

// PrefillConfig configures a PrefillNode.
type PrefillConfig struct {
	Config
	// ListenAddr is the bootstrap address to bind.
	ListenAddr string
	// DataPlane moves the pages (required).
	DataPlane PrefillDataPlane
	// AcceptRegister, if set, vets a decode peer's REGISTER (for example
	// its region layouts against ours); an error rejects it as invalid.
	AcceptRegister func(PeerInfo) error
}

// PrefillNode is prefilld's room owner: it binds the bootstrap socket,
// learns decode peers from REGISTER, binds rooms to them on METADATA and
// drives the prefill room table. Methods are safe for concurrent use.
type PrefillNode struct {
	*core
	pcfg PrefillConfig
	dp   PrefillDataPlane

	lnMu sync.Mutex
	ln   Listener
	addr string

	pmu        sync.Mutex
	peers      map[string]*decodePeer // by instance id
	byID       map[poll.PeerID]*decodePeer
	byEndpoint map[string]*decodePeer
	nextID     poll.PeerID
	departed   map[string]departure // by instance id: said goodbye (goodbye.go)
}

// decodePeer is one registered decode instance. Fields after n are
// guarded by the node's pmu.
type decodePeer struct {
	n         *PrefillNode
	id        poll.PeerID
	instance  string
	epoch     uint64
	endpoint  string
	layouts   []*pdlinkv1.RegionLayout
	route     Route
	lastHeard int64
	lastHB    int64
	up        bool
	farewell  bool // acknowledged our GOODBYE
	dd        *dedupe
}

func (p *decodePeer) peerID() poll.PeerID { return p.id }

func (p *decodePeer) transmit(frame []byte) error {
	p.n.pmu.Lock()
	route := p.route
	p.n.pmu.Unlock()
	return p.n.sendRoute(route, frame)
}

func (p *decodePeer) infoLocked(c *core) PeerInfo {
	return PeerInfo{ID: p.id, Instance: p.instance, Epoch: p.epoch, Addr: p.endpoint, Layouts: p.layouts, Up: p.up, LastHeard: c.wall(p.lastHeard)}
}

// routeTarget answers a dialer that is not a registered peer.
type routeTarget struct {
	n     *PrefillNode
	route Route
}

func (r routeTarget) peerID() poll.PeerID         { return poll.NoPeer }
func (r routeTarget) transmit(frame []byte) error { return r.n.sendRoute(r.route, frame) }

// NewPrefillNode returns a node; Start binds its socket.
func NewPrefillNode(cfg PrefillConfig) (*PrefillNode, error) {
	if cfg.DataPlane == nil || cfg.ListenAddr == "" {
		return nil, fmt.Errorf("%w: PrefillConfig needs ListenAddr and DataPlane", ErrBadArgument)
	}
	c, err := newCore(cfg.Config, poll.Prefill)
	if err != nil {
		return nil, err
	}
	n := &PrefillNode{
		core: c, pcfg: cfg, dp: cfg.DataPlane, addr: cfg.ListenAddr,
		peers: make(map[string]*decodePeer), byID: make(map[poll.PeerID]*decodePeer), byEndpoint: make(map[string]*decodePeer),
	}
	c.hooks = n
	return n, nil
}

// Start binds the bootstrap socket and starts the listener and tick
// workers. The listener is re-bound by its supervisor if it dies.
func (n *PrefillNode) Start(ctx context.Context) error {
	ln, err := n.cfg.Transport.Listen(ctx, n.addr)
	if err != nil {
		return err
	}
	n.lnMu.Lock()
	n.ln, n.addr = ln, ln.Addr()
	n.lnMu.Unlock()
	n.startWorkers()
	n.sup.Go("listener", n.listenLoop)
	n.log.Info("prefill node started", zap.String("addr", n.addr))
	return nil
}

// Addr returns the bound bootstrap address.
func (n *PrefillNode) Addr() string {
	n.lnMu.Lock()
	defer n.lnMu.Unlock()
	return n.addr
}

// Close fails every live room with reason shutdown, tells the peers (one
// attempt each) and says goodbye (one attempt, unless Shutdown did), and
// stops the workers and the socket.
func (n *PrefillNode) Close() error {
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

// kill stops the node without telling anyone, like kill -9 (tests).
func (n *PrefillNode) kill() {
	n.closed.Store(true)
	n.stop()
}

func (n *PrefillNode) stop() {
	n.stopWorkers()
	n.lnMu.Lock()
	if n.ln != nil {
		_ = n.ln.Close()
		n.ln = nil
	}
	n.lnMu.Unlock()
}

func (n *PrefillNode) sendRoute(route Route, frame []byte) error {
	n.lnMu.Lock()
	ln := n.ln
	n.lnMu.Unlock()
	if ln == nil || route == "" {
		return ErrClosed
	}
	return ln.Send(context.Background(), route, frame)
}

// listenLoop is the supervised receive worker. When the socket dies it
// returns an error; the supervisor counts it and runs the loop again,
// which binds the address anew (R6, R12).
func (n *PrefillNode) listenLoop(ctx context.Context) error {
	n.lnMu.Lock()
	ln := n.ln
	n.lnMu.Unlock()
	if ln == nil {
		var err error
		if ln, err = n.cfg.Transport.Listen(ctx, n.Addr()); err != nil {
			return fmt.Errorf("rebind %s: %w", n.Addr(), err)
		}
		n.lnMu.Lock()
		n.ln = ln
		n.lnMu.Unlock()
		n.log.Info("bootstrap socket bound again", zap.String("addr", ln.Addr()))
	}
	for {
		route, frame, err := ln.Recv(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			n.lnMu.Lock()
			if n.ln == ln {
				n.ln = nil
			}
			n.lnMu.Unlock()
			_ = ln.Close()
			return fmt.Errorf("bootstrap socket: %w", err)
		}
		n.handle(route, frame)
	}
}

// Open creates a room for the scheduler (OpenSender): nonce 0 when the
// scheduler does not know it (decode's METADATA binds it), ranks 0 when
// METADATA sets it. A room aborted by decode before it was opened is born
// Failed (R4). It returns the room as created.
func (n *PrefillNode) Open(room poll.RoomID, nonce poll.Nonce, ranks int) (poll.RoomInfo, error) {
	if n.closed.Load() {
		return poll.RoomInfo{}, ErrClosedNode
	}
	if ranks < 0 || ranks > poll.MaxRanks {
		return poll.RoomInfo{}, fmt.Errorf("%w: ranks %d", ErrBadArgument, ranks)
	}
	if err := n.step(poll.Event{Kind: poll.EvOpen, Key: poll.Key{Room: room, Nonce: nonce}, Ranks: uint8(ranks)}); err != nil {
		return poll.RoomInfo{}, err
	}
	return n.Get(room)
}

// FirstSend records the scheduler's Send of a chunk: the first one moves
// the room to Transferring, later ones count as progress.
func (n *PrefillNode) FirstSend(room poll.RoomID) error {
	err := n.step(poll.Event{Kind: poll.EvFirstChunk, Key: poll.Key{Room: room}})
	if errors.Is(err, poll.ErrTerminal) {
		// A room failed but not yet fenced is refused without reading as
		// terminal: the scheduler may free pages once it sees one (I9).
		if in, gerr := n.Get(room); gerr == nil && !in.Visible.Terminal() {
			return fmt.Errorf("%w: room %d is %v", poll.ErrIllegalTransition, room, in.Visible)
		}
	}
	return err
}

// OnProgress is the data plane's callback: bytes of the room moved.
func (n *PrefillNode) OnProgress(key poll.Key) {
	_ = n.step(poll.Event{Kind: poll.EvProgress, Key: key})
}

// OnFailed is the data plane's callback: the room's transfer failed
// (reason transfer_error, checksum...). Decode is told (R8).
func (n *PrefillNode) OnFailed(key poll.Key, reason poll.Reason) {
	_ = n.step(poll.Event{Kind: poll.EvAbortLocal, Key: key, Reason: reason})
}

// Abort fails a room locally (reason "" = aborted:local) and tells decode.
// It returns once the room's Failed is visible (its data plane fenced),
// bounded by ctx; see the package doc, Aborting.
func (n *PrefillNode) Abort(ctx context.Context, room poll.RoomID, reason poll.Reason) error {
	return n.abort(ctx, room, reason)
}

// Subscribe returns a subscription to visible transitions (buf 0: the
// configured default).
func (n *PrefillNode) Subscribe(buf int) *Subscription { return n.subscribe(buf) }

// Peers returns the registered decode peers.
func (n *PrefillNode) Peers() []PeerInfo {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	out := make([]PeerInfo, 0, len(n.peers))
	for _, p := range n.peers {
		out = append(out, p.infoLocked(n.core))
	}
	return out
}

// Counters returns the frame and peer counters.
func (n *PrefillNode) Counters() Counters {
	s := n.ctr.snapshot()
	n.pmu.Lock()
	for _, p := range n.peers {
		if p.up {
			s.PeersUp++
		} else {
			s.PeersDown++
		}
	}
	n.pmu.Unlock()
	return s
}

// notify sends decode the outcome a NotifyPeer effect asks for: ABORT for
// a failure caused here (R8), STATUS otherwise.
func (n *PrefillNode) notify(e poll.Effect) {
	n.pmu.Lock()
	p := n.byID[e.Peer]
	n.pmu.Unlock()
	if p == nil {
		return // the peer restarted or was forgotten; its rooms are gone
	}
	n.sendOutcome(p, e)
}

func (c *core) sendOutcome(dest target, e poll.Effect) {
	env := &pdlinkv1.Envelope{}
	k := e.Key
	if e.Status == poll.Failed {
		env.Body = &pdlinkv1.Envelope_Abort{Abort: &pdlinkv1.Abort{RoomId: uint64(k.Room), Nonce: uint64(k.Nonce), Reason: string(e.Reason)}}
	} else {
		env.Body = &pdlinkv1.Envelope_Status{Status: &pdlinkv1.Status{RoomId: uint64(k.Room), Nonce: uint64(k.Nonce), State: pdlinkv1.RoomState_ROOM_STATE_SUCCESS}}
	}
	c.sendReliable(dest, env, k, c.now()+int64(c.cfg.NotifyHorizon), nil, nil)
}

func (n *PrefillNode) unknownToPeer(target)  {}
func (n *PrefillNode) fence(k poll.Key) bool { return n.dp.Fence(k) }
func (n *PrefillNode) forget(k poll.Key)     { n.dp.Forget(k) }

// maintain sends heartbeats, declares silent peers lost (R10) and forgets
// peers lost for long.
func (n *PrefillNode) maintain(now int64) {
	bound := int64(n.cfg.HeartbeatMisses) * int64(n.cfg.HeartbeatInterval)
	var lost []poll.PeerID
	var hb []*decodePeer
	n.pmu.Lock()
	n.expireDeparturesLocked(now)
	for inst, p := range n.peers {
		if p.farewell {
			continue // it acknowledged our goodbye: it forgot us, we stay quiet
		}
		silent := now - p.lastHeard
		if p.up && silent > bound {
			p.up = false
			lost = append(lost, p.id)
		}
		if !p.up && silent > int64(n.cfg.PeerForgetAfter) {
			delete(n.peers, inst)
			delete(n.byID, p.id)
			if n.byEndpoint[p.endpoint] == p {
				delete(n.byEndpoint, p.endpoint)
			}
			continue
		}
		if now-p.lastHB >= int64(n.cfg.HeartbeatInterval) {
			p.lastHB = now
			hb = append(hb, p)
		}
	}
	n.pmu.Unlock()
	for _, id := range lost {
		n.ctr.peerLost.Add(1)
		n.log.Warn("peer lost", zap.Uint32("peer", uint32(id)))
		_ = n.step(poll.Event{Kind: poll.EvPeerLost, Peer: id})
	}
	if len(hb) > 0 {
		live := uint32(n.Stats().Inflight)
		for _, p := range hb {
			n.sendHeartbeat(p, live)
		}
	}
}

func (c *core) sendHeartbeat(dest target, live uint32) {
	env := c.envelope(0)
	env.Body = &pdlinkv1.Envelope_Heartbeat{Heartbeat: &pdlinkv1.Heartbeat{LiveRooms: live}}
	_, _ = c.transmit(dest, env)
}
