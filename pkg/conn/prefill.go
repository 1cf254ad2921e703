package conn

import (
	"context"
	"errors"
	"fmt"

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

	// roomFrameHook, if set (tests), runs as the link delivers a room frame
	// to the node, on the listener worker.
	roomFrameHook func(from poll.PeerID, seq uint64, ft FrameType)
}

// PrefillNode is prefilld's room owner: it binds the bootstrap socket,
// learns decode peers from REGISTER, binds rooms to them on METADATA and
// drives the prefill room table. Methods are safe for concurrent use.
type PrefillNode struct {
	*core
	pcfg PrefillConfig
	dp   PrefillDataPlane

	// link is the transport side (link_prefill.go): the bootstrap socket,
	// the decode peers, heartbeats, goodbyes. The node reaches peers only
	// through it.
	link *prefillLink
}

// NewPrefillNode returns a node; Start binds its socket.
func NewPrefillNode(cfg PrefillConfig) (*PrefillNode, error) {
	if cfg.DataPlane == nil || cfg.ListenAddr == "" {
		return nil, fmt.Errorf("%w: PrefillConfig needs ListenAddr and DataPlane", ErrBadArgument)
	}
	c, err := newCore(cfg.Config, poll.Prefill)
	if err != nil {
		return nil, err
	}
	n := &PrefillNode{core: c, pcfg: cfg, dp: cfg.DataPlane}
	n.link = newPrefillLink(c, cfg.ListenAddr, cfg.AcceptRegister, n)
	c.hooks = n
	return n, nil
}

// Start binds the bootstrap socket and starts the listener and tick
// workers. The listener is re-bound by its supervisor if it dies.
func (n *PrefillNode) Start(ctx context.Context) error {
	if err := n.link.bind(ctx); err != nil {
		return err
	}
	n.startWorkers()
	n.sup.Go("listener", n.link.listenLoop)
	n.log.Info("prefill node started", zap.String("addr", n.link.Addr()))
	return nil
}

// Addr returns the bound bootstrap address.
func (n *PrefillNode) Addr() string { return n.link.Addr() }

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
	n.link.closeSocket()
}

// Peers returns the registered decode peers.
func (n *PrefillNode) Peers() []PeerInfo { return n.link.peerInfos() }

// Counters returns the frame and peer counters.
func (n *PrefillNode) Counters() Counters { return n.link.counters() }

func (n *PrefillNode) maintain(now int64)       { n.link.maintain(now) }
func (n *PrefillNode) goodbyeTargets() []target { return n.link.goodbyeTargets() }
func (n *PrefillNode) farewell(t target)        { n.link.farewell(t) }

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

func (n *PrefillNode) notify(e poll.Effect) {
	p, ok := n.link.target(e.Peer)
	if !ok {
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
	c.lk.send(dest, env, k, c.now()+int64(c.cfg.NotifyHorizon))
}

func (n *PrefillNode) unknownToPeer(target)  {}
func (n *PrefillNode) fence(k poll.Key) bool { return n.dp.Fence(k) }
func (n *PrefillNode) forget(k poll.Key)     { n.dp.Forget(k) }
