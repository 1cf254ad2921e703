package service

import (
	"fmt"
	"net"
	"net/url"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/room"
)

// MaxBatch bounds the room ids of one Poll or Clear call.
const MaxBatch = 65536

// invalid builds an InvalidArgument status naming the field, with a
// BadRequest detail so clients can read the field programmatically.
func invalid(field, format string, args ...any) error {
	desc := fmt.Sprintf(format, args...)
	st := status.New(codes.InvalidArgument, fmt.Sprintf("%s: %s", field, desc))
	if d, err := st.WithDetails(&errdetails.BadRequest{
		FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: field, Description: desc}},
	}); err == nil {
		st = d
	}
	return st.Err()
}

// validateEnum refuses a value the enum does not define: proto3 keeps
// unknown numbers (999, -1), which would otherwise read as UNSPECIFIED or
// as a filter that matches nothing.
func validateEnum(field string, v protoreflect.Enum) error {
	d := v.Descriptor()
	if d.Values().ByNumber(v.Number()) == nil {
		return invalid(field, "%d is not a %s", v.Number(), d.Name())
	}
	return nil
}

func validateRoomID(field string, id uint64) error {
	if id == 0 {
		return invalid(field, "must be non-zero")
	}
	if id >= 1<<63 {
		return invalid(field, "must fit in 63 bits")
	}
	return nil
}

func validateBatch(field string, ids []uint64) error {
	if len(ids) == 0 || len(ids) > MaxBatch {
		return invalid(field, "must hold 1..%d room ids, got %d", MaxBatch, len(ids))
	}
	for i, id := range ids {
		if err := validateRoomID(fmt.Sprintf("%s[%d]", field, i), id); err != nil {
			return err
		}
	}
	return nil
}

// validateRank applies the one rank rule, conn.ValidateRank (the room
// owner and the peer apply it too), and answers InvalidArgument naming the
// field: an absent rank is rank 0 of 1; a present one needs tp_size
// 1..MaxRanks and tp_rank below it, so an empty Rank{} is refused here on
// every call, never passed on as 0 of 1 to be refused later as a frame.
func validateRank(field string, r *pb.Rank) error {
	if conn.ValidateRank(r) != nil {
		return invalid(field, "tp_rank %d, tp_size %d: want tp_size 1..%d and tp_rank below it (no rank: rank 0 of 1)",
			r.GetTpRank(), r.GetTpSize(), poll.MaxRanks)
	}
	return nil
}

// checkBootstrapAddr checks a prefill bootstrap address the way decoded
// will dial it: tcp://host:port with a host (not the bind-only wildcard *)
// and a port in 1-65535, nothing else in the URL. An address that cannot be
// dialed is refused here, not found out at the room's bootstrap deadline.
func checkBootstrapAddr(field, addr string) error {
	const want = "want tcp://host:port with a port in 1-65535"
	u, err := url.Parse(addr)
	if err != nil || u.Scheme != "tcp" || u.Opaque != "" || u.User != nil || u.Path != "" ||
		u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return invalid(field, "%q: %s", addr, want)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return invalid(field, "%q: %s", addr, want)
	}
	if host == "" || host == "*" {
		return invalid(field, "%q: no host to dial (%s)", addr, want)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return invalid(field, "%q: port %q is not in 1-65535", addr, port)
	}
	return nil
}

// roomEnded answers a call that needs a live room with the room Failed:
// failedRoom once Failed is visible; before the fence only the visible
// state, so no answer shows Failed while a worker may still touch the
// room's pages (I9).
func roomEnded(in poll.RoomInfo) error {
	if in.Visible == poll.Failed {
		return failedRoom(in)
	}
	return status.Errorf(codes.FailedPrecondition, "room %d is %v and ending: poll it until it settles", in.Key.Room, in.Visible)
}

// failedRoom answers a call that needs a live room with the room visibly
// Failed: FailedPrecondition naming the state and the reasons, with an
// ErrorInfo (reason ROOM_FAILED, metadata state, reason, peer_reason) a
// client can read, so the scheduler clears the room instead of retrying.
func failedRoom(in poll.RoomInfo) error {
	desc := fmt.Sprintf("room %d is Failed (reason %s", in.Key.Room, in.Reason)
	if in.PeerReason != poll.ReasonNone {
		desc += ", peer reason " + string(in.PeerReason)
	}
	st := status.New(codes.FailedPrecondition, desc+"): Clear it")
	md := map[string]string{"state": pb.RoomState_ROOM_STATE_FAILED.String(), "reason": string(in.Reason)}
	if in.PeerReason != poll.ReasonNone {
		md["peer_reason"] = string(in.PeerReason)
	}
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: "ROOM_FAILED", Domain: "pdlink", Metadata: md}); err == nil {
		st = d
	}
	return st.Err()
}

// rankOf is a rank validateRank accepted, for the owner (nil: rank 0 of 1).
func rankOf(r *pb.Rank) room.Rank {
	return room.Rank{TP: uint16(r.GetTpRank()), Size: uint16(max(r.GetTpSize(), 1))}
}
