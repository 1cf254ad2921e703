package service

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/room"
)

// DecodeServer implements DecodeService.
type DecodeServer struct {
	pb.UnimplementedDecodeServiceServer
	Node *room.DecodeOwner
	Gate *Gate
}

func (s *DecodeServer) rooms() rooms { return rooms{owner: s.Node} }

// RegisterRegion implements DecodeService.
func (s *DecodeServer) RegisterRegion(_ context.Context, req *pb.DecodeServiceRegisterRegionRequest) (*pb.DecodeServiceRegisterRegionResponse, error) {
	if err := validateRank("layout.rank", req.Layout.GetRank()); err != nil {
		return nil, err
	}
	reg, err := s.Node.RegisterRegion(req.RegionPath, req.Layout)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.DecodeServiceRegisterRegionResponse{RegionId: reg.ID, Generation: reg.File.Generation, Device: reg.File.Dev,
		Inode: reg.File.Ino, RoomsFailed: uint32(reg.RoomsFailed)}, nil
}

// UnregisterRegion implements DecodeService: OK also for a rank with no
// region (unregistered false), so a retry after a lost answer is harmless.
func (s *DecodeServer) UnregisterRegion(_ context.Context, req *pb.DecodeServiceUnregisterRegionRequest) (*pb.DecodeServiceUnregisterRegionResponse, error) {
	if err := validateRank("rank", req.Rank); err != nil {
		return nil, err
	}
	un, err := s.Node.UnregisterRegion(req.Rank)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.DecodeServiceUnregisterRegionResponse{Unregistered: un.Dropped, Generation: un.Generation, RoomsFailed: uint32(un.RoomsFailed)}, nil
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
	if !s.Node.HasRegion() {
		return nil, status.Error(codes.FailedPrecondition, "no region registered: call RegisterRegion first")
	}
	if err := validateRank("rank", req.Rank); err != nil {
		return nil, err
	}
	nonce, err := s.Node.OpenRank(poll.RoomID(req.RoomId), req.PrefillBootstrapAddr, int(req.ExpectedSenders), rankOf(req.Rank))
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
	if err := s.Node.SubmitMetadata(ctx, req); err != nil {
		return nil, toStatus(err)
	}
	return s.metadataStatus(poll.RoomID(req.RoomId))
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
