package sim

import (
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
)

// rankProto is the rank a scheduler names in its calls: nil at TP 1, as
// before ranks, so a TP 1 run sends exactly what it always did.
func rankProto(rank, size int) *pb.Rank {
	if size <= 1 {
		return nil
	}
	return &pb.Rank{TpRank: uint32(rank), TpSize: uint32(size)}
}

// setRank sets an Open request's rank field. Until the open requests carry
// a rank (i15-ranks) there is no field to set, and a daemon refuses a
// second rank's region anyway.
func setRank(m proto.Message, r *pb.Rank) {
	if r == nil {
		return
	}
	msg := m.ProtoReflect()
	if f := msg.Descriptor().Fields().ByName("rank"); f != nil {
		msg.Set(f, protoreflect.ValueOfMessage(r.ProtoReflect()))
	}
}
