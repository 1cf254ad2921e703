package service

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/room"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// DecodeNode is what DecodeServer needs beyond RoomOwner.
type DecodeNode interface {
	RoomOwner
	Open(room poll.RoomID, prefillAddr string, ranks int) (poll.Nonce, error)
	SendMetadata(room poll.RoomID, req room.MetadataRequest) error
	OnProgress(key poll.Key)
	OnRankDone(key poll.Key, rank int)
	OnFailed(key poll.Key, reason poll.Reason)
	Fenced(key poll.Key)
}

// DecodeData adapts the --data-transport's transfer.Sink to the decode
// node's data plane.
// The data listener is bound at start; connections that arrive before a
// region is registered are closed (a sender redials).
type DecodeData struct {
	log  *zap.Logger
	kind transfer.Kind
	rcfg transfer.ReceiverConfig
	node DecodeNode

	slot     regionSlot
	mu       sync.Mutex
	receiver transfer.Sink
	bytes    atomic.Uint64
	refused  atomic.Uint64

	// metadata holds each room's SendMetadata until the room is forgotten,
	// so a retry is answered as the same request and another one refused.
	mdMu     sync.Mutex
	metadata map[poll.Key]*sentMetadata
}

// sentMetadata is what a room's first SendMetadata asked for.
type sentMetadata struct {
	rank      transfer.Rank
	dst       []transfer.Run
	auxIndex  uint32
	prefixLen uint32
	done      chan struct{} // closed once the first call returned
	err       error         // the first call's error; read after done
}

// conflict names what differs from the metadata already sent ("" if
// nothing: the same request).
func (m *sentMetadata) conflict(o *sentMetadata) string {
	switch {
	case m.rank != o.rank:
		return "rank"
	case !slices.Equal(m.dst, o.dst):
		return "dst_pages"
	case m.auxIndex != o.auxIndex:
		return "aux_index"
	case m.prefixLen != o.prefixLen:
		return "prefix_len"
	}
	return ""
}

// claimMetadata records md as key's metadata unless some is recorded
// already: then it returns that one and false.
func (d *DecodeData) claimMetadata(key poll.Key, md *sentMetadata) (*sentMetadata, bool) {
	d.mdMu.Lock()
	defer d.mdMu.Unlock()
	if prev := d.metadata[key]; prev != nil {
		return prev, false
	}
	d.metadata[key] = md
	return md, true
}

// settleMetadata ends the first call for key: a failed one is forgotten so
// the scheduler may try again.
func (d *DecodeData) settleMetadata(key poll.Key, md *sentMetadata, err error) {
	d.mdMu.Lock()
	if err != nil && d.metadata[key] == md {
		delete(d.metadata, key)
	}
	md.err = err
	d.mdMu.Unlock()
	close(md.done)
}

var _ room.DecodeDataPlane = (*DecodeData)(nil)

// NewDecodeData returns the adapter over a data plane of the given kind,
// built when the region is registered; SetNode must be called before use.
func NewDecodeData(kind transfer.Kind, cfg transfer.ReceiverConfig, log *zap.Logger) *DecodeData {
	d := &DecodeData{log: log, kind: kind, rcfg: cfg, metadata: map[poll.Key]*sentMetadata{}}
	d.rcfg.OnFenced = func(k transfer.Key) { d.node.Fenced(pkey(k)) }
	d.slot.onSet = func(r *transfer.Region) error {
		rx, err := transfer.NewSink(d.kind, r, d.rcfg, decodeEvents{d})
		if err != nil {
			return err
		}
		d.mu.Lock()
		d.receiver = rx
		d.mu.Unlock()
		d.log.Info("data plane ready", zap.String("transport", string(d.kind)), zap.String("region", r.Path()))
		return nil
	}
	return d
}

// SetNode wires the room owner the data plane reports to.
func (d *DecodeData) SetNode(n DecodeNode) { d.node = n }

// Layouts returns the registered region layouts (for REGISTER).
func (d *DecodeData) Layouts() []*pb.RegionLayout { return d.slot.layouts() }

// Bytes is the KV bytes written and verified.
func (d *DecodeData) Bytes() uint64 { return d.bytes.Load() }

// Serve hands every accepted data connection to the receiver until ln
// closes.
func (d *DecodeData) Serve(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if isClosed(err) {
				return nil
			}
			return err
		}
		d.mu.Lock()
		rx := d.receiver
		d.mu.Unlock()
		if rx == nil {
			d.refused.Add(1)
			c.Close()
			continue
		}
		rx.ServeConn(c)
	}
}

// Close stops the receiver and unmaps the region.
func (d *DecodeData) Close() {
	d.mu.Lock()
	rx := d.receiver
	d.mu.Unlock()
	if rx != nil {
		rx.Close()
	}
	d.slot.close()
}

// Expect implements room.DecodeDataPlane.
func (d *DecodeData) Expect(md room.Metadata) error {
	d.mu.Lock()
	rx := d.receiver
	d.mu.Unlock()
	region := d.slot.get()
	if rx == nil || region == nil {
		return fmt.Errorf("no region registered")
	}
	l := region.Layout()
	// Checked by SendMetadata against this region; the positions below the
	// prefix are decode's already and are never written.
	runs := runsFrom(runsOf(md.DstPages), int64(md.PrefixLen))
	auxRow := int64(md.AuxIndex)
	if l.Aux.Rows == 0 {
		auxRow = -1
	}
	return rx.Expect(transfer.Expectation{Key: tkey(md.Key, transfer.Rank(md.Rank)), Dst: transfer.SamePages(len(l.Buffers), runs), AuxRow: auxRow})
}

// Fence implements room.DecodeDataPlane without waiting: the receiver
// stops the room at once and answers done when no byte is being written
// into its pages; otherwise its OnFenced tells the node Fenced once the
// writer let go (within FenceGrace plus one piece), R7.
func (d *DecodeData) Fence(key poll.Key) bool {
	d.mu.Lock()
	rx := d.receiver
	d.mu.Unlock()
	if rx == nil {
		return true
	}
	return rx.Fence(d.slot.key(key))
}

// Forget implements room.DecodeDataPlane.
func (d *DecodeData) Forget(key poll.Key) {
	d.Fence(key) // a room reaped unfenced: stop its writes all the same
	d.mdMu.Lock()
	delete(d.metadata, key)
	d.mdMu.Unlock()
}

type decodeEvents struct{ d *DecodeData }

func (e decodeEvents) Progress(k transfer.Key, n int64) {
	e.d.bytes.Add(uint64(n))
	e.d.node.OnProgress(pkey(k))
}

func (e decodeEvents) Complete(k transfer.Key) { e.d.node.OnRankDone(pkey(k), completedRank(k)) }

func (e decodeEvents) Failed(k transfer.Key, r transfer.Reason, err error) {
	e.d.log.Warn("room transfer failed", zap.Uint64("room", k.Room), zap.String("reason", string(r)), zap.Error(err))
	if reason, fails := roomFailure(e.d.log, r); fails {
		e.d.node.OnFailed(pkey(k), reason)
	}
}

// DecodeServer implements DecodeService.
type DecodeServer struct {
	pb.UnimplementedDecodeServiceServer
	Node DecodeNode
	Data *DecodeData
	Gate *Gate
}

func (s *DecodeServer) rooms() rooms { return rooms{owner: s.Node} }

// RegisterRegion implements DecodeService.
func (s *DecodeServer) RegisterRegion(_ context.Context, req *pb.DecodeServiceRegisterRegionRequest) (*pb.DecodeServiceRegisterRegionResponse, error) {
	id, err := s.Data.slot.register(req.RegionPath, req.Layout)
	if err != nil {
		return nil, err
	}
	return &pb.DecodeServiceRegisterRegionResponse{RegionId: id}, nil
}

// OpenReceiver implements DecodeService.
func (s *DecodeServer) OpenReceiver(_ context.Context, req *pb.OpenReceiverRequest) (*pb.OpenReceiverResponse, error) {
	if err := s.Gate.check(); err != nil {
		return nil, err
	}
	if err := validateRoomID("room_id", req.RoomId); err != nil {
		return nil, err
	}
	if err := checkBootstrapAddr("prefill_bootstrap_addr", req.PrefillBootstrapAddr); err != nil {
		return nil, err
	}
	// expected_senders keeps its proto name for compatibility: the ranks
	// expected.
	if req.ExpectedSenders > poll.MaxRanks {
		return nil, invalid("expected_senders", "at most %d", poll.MaxRanks)
	}
	if s.Data.slot.get() == nil {
		return nil, status.Error(codes.FailedPrecondition, "no region registered: call RegisterRegion first")
	}
	nonce, err := s.Node.Open(poll.RoomID(req.RoomId), req.PrefillBootstrapAddr, int(req.ExpectedSenders))
	if err != nil {
		return nil, toStatus(err)
	}
	in, err := s.Node.Get(poll.RoomID(req.RoomId))
	if err != nil {
		return &pb.OpenReceiverResponse{Status: &pb.RoomStatus{RoomId: req.RoomId, Nonce: uint64(nonce), Found: true, State: pb.RoomState_ROOM_STATE_BOOTSTRAPPING}}, nil
	}
	return &pb.OpenReceiverResponse{Status: statusOf(in)}, nil
}

// SendMetadata implements DecodeService. A retry of the same request (a
// client timeout) is answered OK with the room's status whatever state the
// room moved on to, unless it Failed; other metadata for a room that has
// some is refused with AlreadyExists naming the field that differs.
func (s *DecodeServer) SendMetadata(ctx context.Context, req *pb.SendMetadataRequest) (*pb.SendMetadataResponse, error) {
	if err := validateRoomID("room_id", req.RoomId); err != nil {
		return nil, err
	}
	if err := validateRank("rank", req.Rank); err != nil {
		return nil, err
	}
	region := s.Data.slot.get()
	if region == nil {
		return nil, status.Error(codes.FailedPrecondition, "no region registered: call RegisterRegion first")
	}
	if err := s.Data.slot.checkRank("rank", req.Rank); err != nil {
		return nil, err
	}
	l := region.Layout()
	dst, err := pageRuns("dst_pages", req.DstPages, l.Buffers[0].Pages())
	if err != nil {
		return nil, err
	}
	if l.Aux.Rows > 0 && int64(req.AuxIndex) >= l.Aux.Rows {
		return nil, invalid("aux_index", "row %d of %d", req.AuxIndex, l.Aux.Rows)
	}
	if n := transfer.CountPages(dst); int64(req.PrefixLen) > n {
		return nil, invalid("prefix_len", "%d positions, but dst_pages has %d", req.PrefixLen, n)
	}
	rank := rankFromProto(req.Rank)
	mr := room.MetadataRequest{DstPages: req.DstPages, AuxIndex: req.AuxIndex, PrefixLen: req.PrefixLen, Rank: connRank(rank)}
	id := poll.RoomID(req.RoomId)
	in, err := s.Node.Get(id)
	if err != nil {
		return nil, toStatus(err)
	}
	if in.State == poll.Failed {
		return nil, roomEnded(in) // also for a retry: the room takes nothing now
	}
	want := &sentMetadata{rank: rank, dst: dst, auxIndex: req.AuxIndex, prefixLen: req.PrefixLen, done: make(chan struct{})}
	md, first := s.Data.claimMetadata(in.Key, want)
	if !first {
		if field := md.conflict(want); field != "" {
			return nil, status.Errorf(codes.AlreadyExists, "room %d already has metadata with another %s: a retry must repeat the first request", id, field)
		}
		select { // the same request: answer as the first call does
		case <-md.done:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		if md.err != nil {
			return nil, toStatus(md.err)
		}
		return s.metadataStatus(id)
	}
	// The room may have been cleared (and its id reopened) since Get; a
	// claim for a key no longer in the table would never be forgotten.
	if now, err := s.Node.Get(id); err != nil || now.Key != in.Key {
		s.Data.settleMetadata(in.Key, want, poll.ErrNotFound)
		return nil, status.Errorf(codes.NotFound, "room %d ended while its metadata was sent", id)
	}
	err = s.Node.SendMetadata(id, mr)
	s.Data.settleMetadata(in.Key, want, err)
	if err != nil {
		return nil, toStatus(err)
	}
	return s.metadataStatus(id)
}

// metadataStatus answers a SendMetadata that took effect (or had already):
// the room's status, even if it failed since (the call itself did its part).
func (s *DecodeServer) metadataStatus(id poll.RoomID) (*pb.SendMetadataResponse, error) {
	in, err := s.Node.Get(id)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.SendMetadataResponse{Status: statusOf(in)}, nil
}

// Poll implements DecodeService.
func (s *DecodeServer) Poll(_ context.Context, req *pb.DecodeServicePollRequest) (*pb.DecodeServicePollResponse, error) {
	st, err := s.rooms().poll(req.RoomIds)
	if err != nil {
		return nil, err
	}
	return &pb.DecodeServicePollResponse{Statuses: st}, nil
}

// Watch implements DecodeService.
func (s *DecodeServer) Watch(req *pb.DecodeServiceWatchRequest, stream pb.DecodeService_WatchServer) error {
	subscribed := func() error { return stream.SendHeader(metadata.Pairs(WatchHeader, "subscribed")) }
	return s.rooms().watch(stream.Context(), req.Filter, subscribed, func(ev *pb.WatchEvent) error {
		return stream.Send(&pb.DecodeServiceWatchResponse{Event: ev})
	})
}

// Abort implements DecodeService.
func (s *DecodeServer) Abort(ctx context.Context, req *pb.DecodeServiceAbortRequest) (*pb.DecodeServiceAbortResponse, error) {
	st, err := s.rooms().abort(ctx, req.RoomId)
	if err != nil {
		return nil, err
	}
	return &pb.DecodeServiceAbortResponse{Status: st}, nil
}

// Clear implements DecodeService.
func (s *DecodeServer) Clear(_ context.Context, req *pb.DecodeServiceClearRequest) (*pb.DecodeServiceClearResponse, error) {
	res, err := s.rooms().clear(req.RoomIds)
	if err != nil {
		return nil, err
	}
	return &pb.DecodeServiceClearResponse{Results: res}, nil
}
