package room

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// PrefillConfig configures a PrefillOwner.
type PrefillConfig struct {
	conn.Config
	// ListenAddr is the bootstrap address to bind.
	ListenAddr string
	// DataTransport is the data plane's kind (--data-transport; the
	// embedded Config's Transport is the link's) and Sender
	// its configuration: the owner builds it when the region is registered.
	DataTransport transfer.Kind
	Sender        transfer.SenderConfig
	// RegionDirs are the directories a region file must lie under
	// (--region-dir, pkg/regionpath); with none every region is refused.
	RegionDirs []string
	// DataPlane, if set (tests), replaces the data plane built from
	// DataTransport: the owner then takes no Send.
	DataPlane PrefillDataPlane
	// AcceptRegister, if set, vets a decode peer's REGISTER (for example
	// its region layouts against ours); an error rejects it as invalid.
	AcceptRegister func(conn.PeerInfo) error
	// Ended, if set, is called once for every room that reaches a
	// terminal state, as the table moves it there: the duration
	// histograms' feed, which unlike a Subscription drops nothing. It runs
	// on the owner goroutine inside the room table's critical section, so
	// it must be quick, must not block and must not call the owner.
	Ended func(RoomEnd)

	// newTransport, if set (tests), builds the data plane's transport
	// instead of transfer.NewTransport of DataTransport.
	newTransport func(transfer.RegionSet, transfer.SenderConfig) (transfer.Transport, error)
	// roomFrameHook, if set (tests), runs on the owner goroutine as it
	// starts stepping a room frame the link delivered (blocking in it
	// holds the owner, not the reader).
	roomFrameHook func(from poll.PeerID, seq uint64, ft conn.FrameType)
	// performHook (tests) runs on the owner goroutine after a batch's
	// transitions are published, before its effects are performed.
	performHook func([]poll.Effect)
	// publishHook (tests) runs as each transition is published to Watch,
	// on the goroutine that publishes it.
	publishHook func(Transition)
}

// PrefillOwner is prefilld's room owner: it binds the bootstrap socket,
// learns decode peers from REGISTER, binds rooms to them on METADATA and
// drives the prefill room table. Methods are safe for concurrent use.
type PrefillOwner struct {
	*core
	// regionCalls serves RegisterRegion, UnregisterRegion and the region
	// counters over data's slot (unset with a DataPlane of the tests').
	regionCalls
	pcfg PrefillConfig
	dp   PrefillDataPlane
	// data is the data plane built from Transport (nil with a DataPlane
	// of the tests').
	data *PrefillData

	// link is the transport side (pkg/conn's PrefillLink): the bootstrap
	// socket, the decode peers, heartbeats, goodbyes. The node reaches
	// peers only through it.
	link *conn.PrefillLink
}

// NewPrefillOwner returns a node; Start binds its socket.
func NewPrefillOwner(cfg PrefillConfig) (*PrefillOwner, error) {
	if cfg.ListenAddr == "" {
		return nil, fmt.Errorf("%w: PrefillConfig needs ListenAddr", conn.ErrBadArgument)
	}
	paths, err := newRegionPaths(cfg.RegionDirs, cfg.Logger)
	if err != nil {
		return nil, err
	}
	n := &PrefillOwner{pcfg: cfg, dp: cfg.DataPlane}
	link, err := conn.NewPrefillLink(cfg.Config, cfg.ListenAddr, cfg.AcceptRegister, prefillSide{n})
	if err != nil {
		return nil, err
	}
	c, err := newCore(link.Link, cfg.performHook, cfg.publishHook)
	if err != nil {
		return nil, err
	}
	n.core, n.link = c, link
	c.hooks, c.ended = n, cfg.Ended
	if n.dp == nil {
		n.data = newPrefillData(cfg.DataTransport, cfg.Sender, c.log, n)
		n.data.slot.paths = paths
		n.regionCalls = regionCalls{slot: &n.data.slot}
		if cfg.newTransport != nil {
			n.data.newTransport = cfg.newTransport
		}
		n.data.slot.retire = func(rank transfer.Rank, reason poll.Reason, swap func(), hold func() func()) int {
			return c.retireRooms(func() []poll.Key { return n.data.boundKeys(rank) }, reason, swap, hold)
		}
		n.dp = n.data
	}
	return n, nil
}

// Start binds the bootstrap socket and starts the listener and tick
// workers. The listener is re-bound by its supervisor if it dies.
func (n *PrefillOwner) Start(ctx context.Context) error {
	if err := n.link.Bind(ctx); err != nil {
		return err
	}
	n.startWorkers()
	n.link.Listen()
	n.log.Info("prefill node started", zap.String("addr", n.link.Addr()))
	return nil
}

// Addr returns the bound bootstrap address.
func (n *PrefillOwner) Addr() string { return n.link.Addr() }

// Close fails every live room with reason shutdown, tells the peers (one
// attempt each) and says goodbye (one attempt, unless Shutdown did), and
// stops the workers and the socket.
func (n *PrefillOwner) Close() error { return n.core.close(n.stop) }

// kill stops the node without telling anyone (tests).
func (n *PrefillOwner) kill() { n.core.kill(n.stop) }

func (n *PrefillOwner) stop() {
	n.stopWorkers()
	n.link.CloseSocket()
	if n.data != nil {
		n.data.Close()
	}
}

// Peers returns the registered decode peers.
func (n *PrefillOwner) Peers() []conn.PeerInfo { return n.link.Peers() }

// Counters returns the frame and peer counters.
func (n *PrefillOwner) Counters() conn.Counters { return n.link.Counters() }

// Open creates a room for the scheduler (OpenSender): nonce 0 when the
// scheduler does not know it (decode's METADATA binds it), ranks 0 when
// METADATA sets it. A room aborted by decode before it was opened is born
// Failed (R4). It returns the room as created.
func (n *PrefillOwner) Open(room poll.RoomID, nonce poll.Nonce, ranks int) (poll.RoomInfo, error) {
	if n.lk.Closed() {
		return poll.RoomInfo{}, conn.ErrClosedNode
	}
	if ranks < 0 || ranks > poll.MaxRanks {
		return poll.RoomInfo{}, fmt.Errorf("%w: ranks %d", conn.ErrBadArgument, ranks)
	}
	if err := n.step(poll.Event{Kind: poll.EvOpen, Key: poll.Key{Room: room, Nonce: nonce}, Ranks: uint8(ranks)}); err != nil {
		return poll.RoomInfo{}, err
	}
	return n.Get(room)
}

// FirstSend records the scheduler's Send of a chunk: the first one moves
// the room to Transferring, later ones count as progress.
func (n *PrefillOwner) FirstSend(room poll.RoomID) error {
	var err error
	n.exec(func() { err = n.firstSendOwned(room) })
	return err
}

// firstSendOwned is FirstSend inside an owner input.
func (n *PrefillOwner) firstSendOwned(room poll.RoomID) error {
	var err error
	var in poll.RoomInfo
	var gerr error
	n.applyOwned(func() {
		err = n.t.Step(n.now(), poll.Event{Kind: poll.EvFirstChunk, Key: poll.Key{Room: room}})
		in, gerr = n.t.Get(room)
	})
	if errors.Is(err, poll.ErrTerminal) && gerr == nil && !in.Visible.Terminal() {
		// A room failed but not yet fenced is refused without reading as
		// terminal: the scheduler may free pages once it sees one (I9).
		return fmt.Errorf("%w: room %d is %v", poll.ErrIllegalTransition, room, in.Visible)
	}
	return err
}

// OnProgress is the data plane's callback: bytes of the room moved. An
// event nobody waits for, coalesced per room (postProgress).
func (n *PrefillOwner) OnProgress(key poll.Key) {
	n.postProgress(key, func() {
		n.applyOwned(func() { _ = n.t.Step(n.now(), poll.Event{Kind: poll.EvProgress, Key: key}) })
	})
}

// OnFailed is the data plane's callback: the room's transfer failed
// (reason transfer_error, checksum...). Decode is told (R8). It is an event
// nobody waits for: a transfer goroutine that reports a failure never
// waits for an owner that may be fencing it.
func (n *PrefillOwner) OnFailed(key poll.Key, reason poll.Reason) {
	n.post(func() {
		n.applyOwned(func() { _ = n.t.Step(n.now(), poll.Event{Kind: poll.EvAbortLocal, Key: key, Reason: reason}) })
	})
}

// Abort fails a room locally (reason "" = aborted:local) and tells decode.
// It returns once the room's Failed is visible (its data plane fenced),
// bounded by ctx; see the package doc, Aborting.
func (n *PrefillOwner) Abort(ctx context.Context, room poll.RoomID, reason poll.Reason) error {
	return n.abort(ctx, room, reason)
}

// Subscribe returns a subscription to visible transitions (buf 0: the
// configured default).
func (n *PrefillOwner) Subscribe(buf int) *Subscription { return n.subscribe(buf) }

func (n *PrefillOwner) notify(e poll.Effect) {
	p, ok := n.link.Target(e.Peer)
	if !ok {
		return // the peer restarted or was forgotten; its rooms are gone
	}
	n.sendOutcome(p, e)
}

func (c *core) sendOutcome(dest conn.Target, e poll.Effect) {
	env := &pdlinkv1.Envelope{}
	k := e.Key
	if e.Status == poll.Failed {
		env.Body = &pdlinkv1.Envelope_Abort{Abort: &pdlinkv1.Abort{RoomId: uint64(k.Room), Nonce: uint64(k.Nonce), Reason: string(e.Reason)}}
	} else {
		env.Body = &pdlinkv1.Envelope_Status{Status: &pdlinkv1.Status{RoomId: uint64(k.Room), Nonce: uint64(k.Nonce), State: pdlinkv1.RoomState_ROOM_STATE_SUCCESS}}
	}
	c.lk.Send(dest, env, k, c.now()+int64(c.cfg.NotifyHorizon))
}

func (n *PrefillOwner) fence(k poll.Key) bool { return n.dp.Fence(k) }
func (n *PrefillOwner) forget(k poll.Key)     { n.dp.Forget(k) }
