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

// PrefillServer implements PrefillService.
type PrefillServer struct {
	pb.UnimplementedPrefillServiceServer
	Node *room.PrefillOwner
	Gate *Gate
}

func (s *PrefillServer) rooms() rooms { return rooms{owner: s.Node} }

// RegisterRegion implements PrefillService.
func (s *PrefillServer) RegisterRegion(_ context.Context, req *pb.PrefillServiceRegisterRegionRequest) (*pb.PrefillServiceRegisterRegionResponse, error) {
	if err := validateRank("layout.rank", req.Layout.GetRank()); err != nil {
		return nil, err
	}
	reg, err := s.Node.RegisterRegion(req.RegionPath, req.Layout)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.PrefillServiceRegisterRegionResponse{RegionId: reg.ID, Generation: reg.File.Generation, Device: reg.File.Dev,
		Inode: reg.File.Ino, RoomsFailed: uint32(reg.RoomsFailed)}, nil
}

// UnregisterRegion implements PrefillService: OK also for a rank with no
// region (unregistered false), so a retry after a lost answer is harmless.
func (s *PrefillServer) UnregisterRegion(_ context.Context, req *pb.PrefillServiceUnregisterRegionRequest) (*pb.PrefillServiceUnregisterRegionResponse, error) {
	if err := validateRank("rank", req.Rank); err != nil {
		return nil, err
	}
	un, err := s.Node.UnregisterRegion(req.Rank)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.PrefillServiceUnregisterRegionResponse{Unregistered: un.Dropped, Generation: un.Generation, RoomsFailed: uint32(un.RoomsFailed)}, nil
}

// OpenSender implements PrefillService.
func (s *PrefillServer) OpenSender(_ context.Context, req *pb.OpenSenderRequest) (*pb.OpenSenderResponse, error) {
	if err := s.Gate.check(); err != nil {
		return nil, err
	}
	if err := validateRoomID("room_id", req.RoomId); err != nil {
		return nil, err
	}
	if err := validateRank("rank", req.Rank); err != nil {
		return nil, err
	}
	if req.ExpectedReceivers > 1 {
		return nil, status.Error(codes.Unimplemented, "expected_receivers: the decode ranks a prefill rank feeds come from the rank mapping; more than one (dummies, head slices) is not served yet")
	}
	in, err := s.Node.OpenRank(poll.RoomID(req.RoomId), poll.Nonce(req.Nonce), rankOf(req.Rank))
	if err != nil {
		return nil, toStatus(err)
	}
	st := statusOf(in)
	if in.Visible != poll.Bootstrapping {
		// A rank joining a room decode bound already: its scheduler's
		// cache starts from this answer, so it carries the prefix.
		if now, err := s.rooms().status(req.RoomId); err == nil && now.Nonce == st.Nonce {
			st = now
		}
	}
	return &pb.OpenSenderResponse{Status: st}, nil
}

// Send implements PrefillService.
func (s *PrefillServer) Send(ctx context.Context, req *pb.SendRequest) (*pb.SendResponse, error) {
	if err := validateRoomID("room_id", req.RoomId); err != nil {
		return nil, err
	}
	if err := validateRank("rank", req.Rank); err != nil {
		return nil, err
	}
	if err := s.Node.Send(ctx, req); err != nil {
		return nil, toStatus(err)
	}
	st, err := s.rooms().status(req.RoomId)
	if err != nil {
		return nil, err
	}
	return &pb.SendResponse{Status: st}, nil
}

// Poll implements PrefillService.
func (s *PrefillServer) Poll(_ context.Context, req *pb.PrefillServicePollRequest) (*pb.PrefillServicePollResponse, error) {
	st, err := s.rooms().poll(req.RoomIds)
	if err != nil {
		return nil, err
	}
	return &pb.PrefillServicePollResponse{Statuses: st}, nil
}

// Watch implements PrefillService.
func (s *PrefillServer) Watch(req *pb.PrefillServiceWatchRequest, stream pb.PrefillService_WatchServer) error {
	subscribed := func() error { return stream.SendHeader(metadata.Pairs(WatchHeader, "subscribed")) }
	return s.rooms().watch(stream.Context(), req.Filter, subscribed, func(ev *pb.WatchEvent) error {
		return stream.Send(&pb.PrefillServiceWatchResponse{Event: ev})
	})
}

// Abort implements PrefillService.
func (s *PrefillServer) Abort(ctx context.Context, req *pb.PrefillServiceAbortRequest) (*pb.PrefillServiceAbortResponse, error) {
	st, err := s.rooms().abort(ctx, req.RoomId)
	if err != nil {
		return nil, err
	}
	return &pb.PrefillServiceAbortResponse{Status: st}, nil
}

// Clear implements PrefillService.
func (s *PrefillServer) Clear(_ context.Context, req *pb.PrefillServiceClearRequest) (*pb.PrefillServiceClearResponse, error) {
	res, err := s.rooms().clear(req.RoomIds)
	if err != nil {
		return nil, err
	}
	return &pb.PrefillServiceClearResponse{Results: res}, nil
}
