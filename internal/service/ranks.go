package service

import (
	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/room"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// One vocabulary, rank, from the proto to the data plane: the proto's Rank
// (tp_rank, tp_size) is room.Rank on the control plane and transfer.Rank
// in every data-plane key; a completion's rank is poll's Rank index.

// rankFromProto is a rank validateRank accepted; nil or tp_size 0 is rank
// 0 of 1.
func rankFromProto(r *pb.Rank) transfer.Rank {
	if r == nil || r.TpSize == 0 {
		return transfer.Rank{TP: 0, Size: 1}
	}
	return transfer.Rank{TP: uint16(r.TpRank), Size: uint16(r.TpSize)}
}

// connRank is the control plane's name for the same rank.
func connRank(r transfer.Rank) room.Rank { return room.Rank(r) }

// tkey is the data-plane key of rank's share of the room.
func tkey(k poll.Key, rank transfer.Rank) transfer.Key {
	return transfer.Key{Room: uint64(k.Room), Nonce: uint64(k.Nonce), Rank: rank}
}

// pkey is the room a data-plane key is about, whichever rank.
func pkey(k transfer.Key) poll.Key {
	return poll.Key{Room: poll.RoomID(k.Room), Nonce: poll.Nonce(k.Nonce)}
}

// completedRank is the poll rank index a completion reports. With equal
// TP on both sides, the only mapping until ranks fan out (issue 15),
// decode rank i is fed by prefill rank i alone, so the rank of the
// expectation that completed is the index of the rank that sent it.
func completedRank(k transfer.Key) int { return int(k.Rank.TP) }
