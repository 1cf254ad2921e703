package sim

import (
	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"strings"

	"google.golang.org/grpc/status"
)

func grpcCode(err error) string {
	return strings.ToLower(status.Code(err).String())
}

func unreachable(err error) *pb.RoomStatus {
	return &pb.RoomStatus{Found: false, State: pb.RoomState_ROOM_STATE_FAILED, Reason: "unreachable:" + grpcCode(err)}
}
