package room

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// DecodeConfig configures a DecodeOwner.
type DecodeConfig struct {
	conn.Config
	// DataEndpoint is the host:port of this daemon's data listener, sent
	// in REGISTER; Layouts are its region layouts.
	DataEndpoint string
	Layouts      []*pdlinkv1.RegionLayout
	// LayoutsFunc, if set, is read at every REGISTER instead of Layouts:
	// the engine registers its regions over gRPC after the daemon starts.
	LayoutsFunc func() []*pdlinkv1.RegionLayout
	// DataTransport is the data plane's kind (--data-transport; the
	// embedded Config's Transport is the link's) and Receiver
	// its configuration: the owner builds it when the region is
	// registered, and REGISTER carries that region's layout.
	DataTransport transfer.Kind
	Receiver      transfer.ReceiverConfig
	// RegionDirs are the directories a region file must lie under
	// (--region-dir, pkg/regionpath); with none every region is refused.
	RegionDirs []string
	// DataPlane, if set (tests), replaces the data plane built from
	// DataTransport: the owner then takes no SubmitMetadata.
	DataPlane DecodeDataPlane
	// Ended, if set, is called once for every room that reaches a
	// terminal state (see PrefillConfig.Ended).
	Ended func(RoomEnd)
	// newSink, if set (tests), builds the data plane's sink over the
	// region (transfer.NewSink of DataTransport otherwise).
	newSink func(transfer.RegionSet, transfer.ReceiverConfig, transfer.Events) (transfer.Sink, error)

	openHook func() // tests: runs in Open between reading the prefill instance and opening the room
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

// DecodeOwner is decoded's room owner: it keeps one Conn per prefill
// daemon (dialed on the first Open for that address, registered first,
// registered again after the prefill restarts), draws room nonces, sends
// METADATA reliably and drives the decode room table. Methods are safe for
// concurrent use.
type DecodeOwner struct {
	*core
	// regionCalls serves RegisterRegion, UnregisterRegion and the region
	// counters over data's slot (unset with a DataPlane of the tests').
	regionCalls
	dcfg DecodeConfig
	dp   DecodeDataPlane
	// data is the data plane built from Transport (nil with a DataPlane
	// of the tests').
	data *DecodeData
	// link is the transport side (pkg/conn's DecodeLink): sessions,
	// REGISTER, heartbeats, goodbyes. The node reaches peers only through
	// it.
	link *conn.DecodeLink
}

func (n *DecodeOwner) layouts() []*pdlinkv1.RegionLayout {
	if n.dcfg.LayoutsFunc != nil {
		return n.dcfg.LayoutsFunc()
	}
	if n.data != nil {
		return n.data.Layouts()
	}
	return n.dcfg.Layouts
}

// NewDecodeOwner returns a node; Start starts its workers.
func NewDecodeOwner(cfg DecodeConfig) (*DecodeOwner, error) {
	paths, err := newRegionPaths(cfg.RegionDirs, cfg.Logger)
	if err != nil {
		return nil, err
	}
	n := &DecodeOwner{dcfg: cfg, dp: cfg.DataPlane}
	link, err := conn.NewDecodeLink(cfg.Config, cfg.DataEndpoint, n.layouts, decodeSide{n})
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
		n.data = newDecodeData(cfg.DataTransport, cfg.Receiver, c.log, n)
		n.data.slot.paths = paths
		n.regionCalls = regionCalls{slot: &n.data.slot}
		if cfg.newSink != nil {
			n.data.newSink = cfg.newSink
		}
		n.data.slot.retire = func(rank transfer.Rank, reason poll.Reason, swap func(), hold func() func()) int {
			return c.retireRooms(func() []poll.Key { return n.data.expectedKeys(rank) }, reason, swap, hold)
		}
		// A new layout reaches the prefill daemons in REGISTER.
		n.data.slot.onLayout = link.RegisterAgain
		n.dp = n.data
	}
	return n, nil
}

// Start starts the tick worker; connections are made on demand.
func (n *DecodeOwner) Start(context.Context) error {
	n.startWorkers()
	n.log.Info("decode node started", zap.String("data_endpoint", n.dcfg.DataEndpoint))
	return nil
}

// Close fails every live room with reason shutdown, tells the prefill
// daemons (one attempt each) and says goodbye (one attempt, unless
// Shutdown did), and stops the workers and connections.
func (n *DecodeOwner) Close() error { return n.core.close(n.stop) }

// kill stops the node without telling anyone (tests).
func (n *DecodeOwner) kill() { n.core.kill(n.stop) }

func (n *DecodeOwner) stop() {
	n.stopWorkers()
	n.link.CloseSessions()
	if n.data != nil {
		n.data.Close()
	}
}

// Open creates a room for the scheduler (OpenReceiver), bound to the
// prefill daemon at prefillAddr, expecting ranks distinct prefill ranks
// (0 means 1). It returns the nonce drawn for the room (crypto-random,
// non-zero).
func (n *DecodeOwner) Open(room poll.RoomID, prefillAddr string, ranks int) (poll.Nonce, error) {
	if n.lk.Closed() {
		return 0, conn.ErrClosedNode
	}
	if prefillAddr == "" || ranks < 0 || ranks > poll.MaxRanks {
		return 0, fmt.Errorf("%w: address %q ranks %d", conn.ErrBadArgument, prefillAddr, ranks)
	}
	s, err := n.link.Session(prefillAddr)
	if err != nil {
		return 0, err
	}
	id := n.link.CurrentPeer(s)
	nonce := poll.Nonce(randomUint64())
	if n.dcfg.openHook != nil {
		n.dcfg.openHook()
	}
	if err := n.step(poll.Event{Kind: poll.EvOpen, Key: poll.Key{Room: room, Nonce: nonce}, Peer: id, Ranks: uint8(max(ranks, 1))}); err != nil {
		return 0, err
	}
	if current := n.link.CurrentPeer(s); current != id {
		// The prefill restarted between reading its id and the open, and
		// its rooms were moved before this one existed: move it too.
		_ = n.step(poll.Event{Kind: poll.EvPeerReplaced, Peer: id, NewPeer: current})
	}
	return nonce, nil
}

// randomUint64 draws a non-zero random number (crypto/rand).
func randomUint64() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if v := binary.LittleEndian.Uint64(b[:]); v != 0 {
			return v
		}
	}
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
	// PrefixLen is how many leading positions of DstPages decode already
	// holds (the edge checked it is at most their count).
	PrefixLen uint32
}
