package service

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/room"
)

// RoomOwner is what the services need from a node (room.PrefillOwner and
// room.DecodeOwner both satisfy it).
type RoomOwner interface {
	PollStatus(ids []poll.RoomID, out []room.Status) []room.Status
	Get(id poll.RoomID) (poll.RoomInfo, error)
	List(f poll.Filter, pageToken string, limit int) ([]poll.RoomInfo, string, error)
	Clear(ids []poll.RoomID, errs []error)
	// Abort returns once the room's Failed is visible (its fence done),
	// bounded by ctx.
	Abort(ctx context.Context, room poll.RoomID, reason poll.Reason) error
	Subscribe(buf int) *room.Subscription
	WallTime(ns int64) time.Time
	Peers() []conn.PeerInfo
}

// Gate refuses new rooms while the daemon drains.
type Gate struct{ draining atomic.Bool }

// Drain makes every later open fail with Unavailable.
func (g *Gate) Drain() { g.draining.Store(true) }

// Draining reports whether Drain was called.
func (g *Gate) Draining() bool { return g.draining.Load() }

func (g *Gate) check() error {
	if g.draining.Load() {
		return status.Error(codes.Unavailable, "draining: not accepting new rooms")
	}
	return nil
}

func stateToProto(s poll.State) pb.RoomState {
	switch s {
	case poll.Bootstrapping:
		return pb.RoomState_ROOM_STATE_BOOTSTRAPPING
	case poll.WaitingForInput:
		return pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT
	case poll.Transferring:
		return pb.RoomState_ROOM_STATE_TRANSFERRING
	case poll.Success:
		return pb.RoomState_ROOM_STATE_SUCCESS
	case poll.Failed:
		return pb.RoomState_ROOM_STATE_FAILED
	}
	return pb.RoomState_ROOM_STATE_UNSPECIFIED
}

func stateFromProto(s pb.RoomState) poll.State {
	switch s {
	case pb.RoomState_ROOM_STATE_BOOTSTRAPPING:
		return poll.Bootstrapping
	case pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT:
		return poll.WaitingForInput
	case pb.RoomState_ROOM_STATE_TRANSFERRING:
		return poll.Transferring
	case pb.RoomState_ROOM_STATE_SUCCESS:
		return poll.Success
	case pb.RoomState_ROOM_STATE_FAILED:
		return poll.Failed
	}
	return poll.StateNone
}

// statusOf is what the scheduler may see of a room: its visible state and
// nonce, and the reasons only once Failed is visible (I9).
func statusOf(in poll.RoomInfo) *pb.RoomStatus {
	st := &pb.RoomStatus{RoomId: uint64(in.Key.Room), Nonce: uint64(in.Key.Nonce), Found: true, State: stateToProto(in.Visible)}
	if in.Visible == poll.Failed {
		st.Reason, st.PeerReason = string(in.Reason), string(in.PeerReason)
	}
	return st
}

// toStatus maps the room owner's sentinel errors to gRPC codes.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return err
	}
	var field *room.FieldError
	if errors.As(err, &field) {
		return invalid(field.Field, "%s", field.Desc)
	}
	var ended *room.EndedError
	if errors.As(err, &ended) {
		return roomEnded(ended.Info)
	}
	if errors.Is(err, room.ErrBadHeadSlice) || errors.Is(err, room.ErrHeadSliceMismatch) {
		return headSliceRefused(err)
	}
	code := codes.Internal
	switch {
	case errors.Is(err, poll.ErrNotFound):
		code = codes.NotFound
	case errors.Is(err, poll.ErrAlreadyExists), errors.Is(err, poll.ErrCollision):
		code = codes.AlreadyExists
	case errors.Is(err, poll.ErrResourceExhausted):
		code = codes.ResourceExhausted
	case errors.Is(err, poll.ErrNotTerminal), errors.Is(err, poll.ErrTerminal),
		errors.Is(err, poll.ErrIllegalTransition), errors.Is(err, conn.ErrNotBootstrapping),
		errors.Is(err, poll.ErrNonceMismatch), errors.Is(err, room.ErrNoRegion), errors.Is(err, room.ErrNotSendable),
		errors.Is(err, room.ErrTransferRefused), errors.Is(err, room.ErrRankMapping):
		code = codes.FailedPrecondition
	case errors.Is(err, room.ErrMetadataConflict):
		code = codes.AlreadyExists
	case errors.Is(err, room.ErrUnsupported):
		code = codes.Unimplemented
	case errors.Is(err, room.ErrRegionPathRefused):
		code = codes.PermissionDenied
	case errors.Is(err, poll.ErrInvalidEvent), errors.Is(err, conn.ErrBadArgument):
		code = codes.InvalidArgument
	case errors.Is(err, conn.ErrClosedNode):
		code = codes.Unavailable
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	}
	return status.Error(code, err.Error())
}

// headSliceRefused answers a head slice the data plane refused: one
// outside its row is InvalidArgument, one the rank mapping does not give
// the pair FailedPrecondition (the two daemons' layouts disagree), with an
// ErrorInfo whose metadata reason a client can read (bad_slice,
// slice_mismatch); the room itself failed on the data plane, and is
// counted there as a refused chunk's room is.
func headSliceRefused(err error) error {
	code, reason := codes.InvalidArgument, "bad_slice"
	if errors.Is(err, room.ErrHeadSliceMismatch) {
		code, reason = codes.FailedPrecondition, "slice_mismatch"
	}
	st := status.New(code, err.Error())
	if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: "HEAD_SLICE_REFUSED", Domain: "pdlink",
		Metadata: map[string]string{"reason": reason}}); derr == nil {
		st = d
	}
	return st.Err()
}

// rooms implements the calls both scheduler services share.
type rooms struct {
	owner RoomOwner
}

func (r rooms) poll(ids []uint64) ([]*pb.RoomStatus, error) {
	if err := validateBatch("room_ids", ids); err != nil {
		return nil, err
	}
	pids := make([]poll.RoomID, len(ids))
	for i, id := range ids {
		pids[i] = poll.RoomID(id)
	}
	sts := r.owner.PollStatus(pids, make([]room.Status, 0, len(ids)))
	out := make([]*pb.RoomStatus, len(ids))
	for i, st := range sts {
		out[i] = statusProto(ids[i], st)
	}
	return out, nil
}

// statusProto is a room's PollStatus as the proto's RoomStatus.
func statusProto(id uint64, st room.Status) *pb.RoomStatus {
	return &pb.RoomStatus{RoomId: id, Nonce: uint64(st.Nonce), Found: st.State != poll.StateNone, State: stateToProto(st.State),
		Reason: string(st.Reason), PeerReason: string(st.PeerReason), PrefixLen: st.PrefixLen}
}

// status is one room's PollStatus, for a call's answer: NotFound for a
// room the daemon does not hold.
func (r rooms) status(id uint64) (*pb.RoomStatus, error) {
	var one [1]room.Status
	st := r.owner.PollStatus([]poll.RoomID{poll.RoomID(id)}, one[:0])[0]
	if st.State == poll.StateNone {
		return nil, toStatus(fmt.Errorf("room %d: %w", id, poll.ErrNotFound))
	}
	return statusProto(id, st), nil
}

func (r rooms) abort(ctx context.Context, id uint64) (*pb.RoomStatus, error) {
	if err := validateRoomID("room_id", id); err != nil {
		return nil, err
	}
	if err := r.owner.Abort(ctx, poll.RoomID(id), poll.ReasonAbortedLocal); err != nil && !errors.Is(err, poll.ErrTerminal) {
		return nil, toStatus(err)
	}
	return r.status(id)
}

func (r rooms) clear(ids []uint64) ([]*pb.ClearResult, error) {
	if err := validateBatch("room_ids", ids); err != nil {
		return nil, err
	}
	pids := make([]poll.RoomID, len(ids))
	for i, id := range ids {
		pids[i] = poll.RoomID(id)
	}
	errs := make([]error, len(ids))
	r.owner.Clear(pids, errs)
	out := make([]*pb.ClearResult, len(ids))
	for i, err := range errs {
		res := &pb.ClearResult{RoomId: ids[i], Cleared: err == nil}
		switch {
		case err == nil:
		case errors.Is(err, poll.ErrNotFound):
			res.Error = "NOT_FOUND"
		case errors.Is(err, poll.ErrNotTerminal):
			res.Error = "NOT_TERMINAL"
		default:
			res.Error = err.Error()
		}
		out[i] = res
	}
	return out, nil
}

// WatchHeader is the response header a Watch stream sends once it is
// subscribed: transitions after the client received it are not missed.
const WatchHeader = "pdlink-watch"

// watchBuffer is each Watch stream's subscription buffer (0: the node's
// default); tests shrink it, and watchStall (nil outside tests) holds the
// stream's goroutine before each send, to play a slow reader.
var (
	watchBuffer = 0
	watchStall  func()
)

// watch streams transitions until ctx ends. A transition the stream could
// not take in time is counted, and the count is sent as a "missed" event
// before the next transition so the reader knows to re-sync with Poll.
//
// subscribed is called once the subscription exists (it sends the
// stream's header), so a client that waits for the header knows no later
// transition can be missed for lack of a subscription.
func (r rooms) watch(ctx context.Context, f *pb.WatchFilter, subscribed func() error, send func(*pb.WatchEvent) error) error {
	want := map[poll.State]bool{}
	ids := map[uint64]bool{}
	if f != nil {
		for i, s := range f.ToStates {
			field := fmt.Sprintf("filter.to_states[%d]", i)
			if err := validateEnum(field, s); err != nil {
				return err
			}
			if s == pb.RoomState_ROOM_STATE_UNSPECIFIED {
				// No transition goes to UNSPECIFIED: the stream would
				// stay silent for ever.
				return invalid(field, "UNSPECIFIED matches no transition; leave to_states empty to match all")
			}
			want[stateFromProto(s)] = true
		}
		for _, id := range f.RoomIds {
			ids[id] = true
		}
	}
	sub := r.owner.Subscribe(watchBuffer)
	defer sub.Close()
	if err := subscribed(); err != nil {
		return err
	}
	var reported uint64
	for {
		select {
		case <-ctx.Done():
			return nil
		case tr, ok := <-sub.C():
			if !ok {
				return status.Error(codes.Unavailable, "daemon stopping")
			}
			if watchStall != nil {
				watchStall()
			}
			if d := sub.Dropped(); d > reported {
				if err := send(&pb.WatchEvent{Event: &pb.WatchEvent_Missed{Missed: d - reported}}); err != nil {
					return err
				}
				reported = d
			}
			if len(want) > 0 && !want[tr.To] || len(ids) > 0 && !ids[uint64(tr.Key.Room)] {
				continue
			}
			ev := &pb.WatchEvent{Event: &pb.WatchEvent_Transition{Transition: &pb.Transition{
				RoomId: uint64(tr.Key.Room), Nonce: uint64(tr.Key.Nonce),
				From: stateToProto(tr.From), To: stateToProto(tr.To),
				Reason: string(tr.Reason), PeerReason: string(tr.PeerReason), PrefixLen: tr.PrefixLen, At: timestamppb.New(tr.At),
			}}}
			if err := send(ev); err != nil {
				return err
			}
		}
	}
}

// AdminServer serves AdminService from a room owner.
type AdminServer struct {
	pb.UnimplementedAdminServiceServer
	Owner RoomOwner
	Side  pb.Side
	Now   func() time.Time
}

func (a *AdminServer) peerName(id poll.PeerID) string {
	if id == poll.NoPeer {
		return ""
	}
	for _, p := range a.Owner.Peers() {
		if p.ID == id {
			if p.Addr != "" {
				return p.Addr
			}
			return p.Instance
		}
	}
	return strconv.FormatUint(uint64(id), 10)
}

func (a *AdminServer) info(in poll.RoomInfo) *pb.RoomInfo {
	now := a.Now()
	created := a.Owner.WallTime(in.CreatedAt)
	entered := a.Owner.WallTime(in.StateEnteredAt)
	out := &pb.RoomInfo{
		RoomId: uint64(in.Key.Room), Nonce: uint64(in.Key.Nonce), Side: a.Side,
		State: stateToProto(in.State), VisibleState: stateToProto(in.Visible),
		Reason: string(in.Reason), PeerReason: string(in.PeerReason), Peer: a.peerName(in.Peer),
		CreatedAt: timestamppb.New(created), Age: durationpb.New(now.Sub(created)),
		StateAge: durationpb.New(now.Sub(entered)), HistoryDropped: uint32(in.HistoryDropped),
	}
	if in.Deadline > 0 {
		out.Deadline = timestamppb.New(a.Owner.WallTime(in.Deadline))
	}
	for _, h := range in.History {
		tr := &pb.Transition{
			RoomId: uint64(in.Key.Room), Nonce: uint64(in.Key.Nonce),
			From: stateToProto(h.From), To: stateToProto(h.To), Reason: string(h.Reason),
			At: timestamppb.New(a.Owner.WallTime(h.At)),
		}
		if h.To == poll.Failed {
			tr.PeerReason = string(in.PeerReason) // a room fails once: this is that move
		}
		out.History = append(out.History, tr)
	}
	return out
}

// ListRooms implements AdminService.
func (a *AdminServer) ListRooms(_ context.Context, req *pb.ListRoomsRequest) (*pb.ListRoomsResponse, error) {
	limit := int(req.PageSize)
	if limit == 0 {
		limit = 100
	}
	if limit < 1 || limit > 1000 {
		return nil, invalid("page_size", "must be 0 or 1..1000")
	}
	if err := validateEnum("state", req.State); err != nil {
		return nil, err
	}
	f := poll.Filter{State: stateFromProto(req.State)}
	if req.MinAge != nil {
		if err := req.MinAge.CheckValid(); err != nil || req.MinAge.AsDuration() < 0 {
			return nil, invalid("min_age", "must be a non-negative duration")
		}
		f.MinAge = req.MinAge.AsDuration()
	}
	if req.Peer != "" {
		f.Peer = poll.PeerID(^uint32(0)) // matches nothing unless the peer is known
		for _, p := range a.Owner.Peers() {
			if p.Addr == req.Peer || p.Instance == req.Peer {
				f.Peer = p.ID
			}
		}
	}
	infos, next, err := a.Owner.List(f, req.PageToken, limit)
	if err != nil {
		if errors.Is(err, poll.ErrInvalidEvent) {
			return nil, invalid("page_token", "not a token from a previous response")
		}
		return nil, toStatus(err)
	}
	resp := &pb.ListRoomsResponse{NextPageToken: next}
	for _, in := range infos {
		resp.Rooms = append(resp.Rooms, a.info(in))
	}
	return resp, nil
}

// GetRoom implements AdminService.
func (a *AdminServer) GetRoom(_ context.Context, req *pb.GetRoomRequest) (*pb.GetRoomResponse, error) {
	if err := validateRoomID("room_id", req.RoomId); err != nil {
		return nil, err
	}
	in, err := a.Owner.Get(poll.RoomID(req.RoomId))
	if err != nil {
		return nil, toStatus(fmt.Errorf("room %d: %w", req.RoomId, err))
	}
	return &pb.GetRoomResponse{Room: a.info(in)}, nil
}
