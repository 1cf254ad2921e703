package sim

import pb "github.com/pdlink/pdlink/api/pdlink/v1"

// rankProto is the rank a scheduler names in its calls: nil at TP 1, as
// before ranks, so a TP 1 run sends exactly what it always did.
func rankProto(rank, size int) *pb.Rank {
	if size <= 1 {
		return nil
	}
	return &pb.Rank{TpRank: uint32(rank), TpSize: uint32(size)}
}
