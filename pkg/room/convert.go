package room

import (
	"errors"
	"fmt"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/pagelist"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/rankmap"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// The proto <-> data-plane conversions: the room owner is the only one
// that speaks transfer's vocabulary (the service does not import it).

// pageRuns is the gRPC-in check of a scheduler's page list, the only one on
// this side: it turns the list into runs in request order after checking it
// against a buffer of pages pages (exactly one of indices and runs, every
// page in range, none twice) and against package pagelist's bounds, which
// the peer's frame check applies too. Past this point the list is trusted
// (runsOf converts it again without checking).
func pageRuns(field string, pl *pb.PageList, pages int64) ([]transfer.Run, error) {
	if pl == nil || (len(pl.Indices) == 0) == (len(pl.Runs) == 0) {
		return nil, invalid(field, "exactly one of indices and runs must be non-empty")
	}
	var runs []transfer.Run
	if len(pl.Indices) > 0 {
		if len(pl.Indices) > pagelist.MaxPages {
			return nil, invalid(field+".indices", "at most %d pages per call", pagelist.MaxPages)
		}
		if n := pagelist.IndexBytes(pl.Indices); n > pagelist.MaxListBytes {
			return nil, invalid(field+".indices", "encode to %d bytes, over the %d one frame carries: send runs", n, pagelist.MaxListBytes)
		}
		for i, p := range pl.Indices {
			if p < 0 || int64(p) >= pages {
				return nil, invalid(fmt.Sprintf("%s.indices[%d]", field, i), "page %d outside 0..%d", p, pages-1)
			}
		}
		runs = transfer.RunsFromPages(pl.Indices)
	} else {
		if len(pl.Runs) > pagelist.MaxRuns {
			return nil, invalid(field+".runs", "at most %d runs per call", pagelist.MaxRuns)
		}
		var total int64
		for i, r := range pl.Runs {
			if r.Start < 0 || r.Count < 1 || int64(r.Start)+int64(r.Count) > pages {
				return nil, invalid(fmt.Sprintf("%s.runs[%d]", field, i), "run {start %d, count %d} outside 0..%d", r.Start, r.Count, pages-1)
			}
			total += int64(r.Count)
			runs = append(runs, transfer.Run{Start: r.Start, Count: r.Count})
		}
		if total > pagelist.MaxPages {
			return nil, invalid(field+".runs", "at most %d pages per call", pagelist.MaxPages)
		}
		runs = transfer.Coalesce(runs)
	}
	if err := transfer.ValidateRuns(runs, pages); err != nil {
		return nil, invalid(field, "%s", repeatedPageMessage(err))
	}
	return runs, nil
}

// runsOf converts a page list pageRuns accepted, in request order, without
// checking it again.
func runsOf(pl *pb.PageList) []transfer.Run {
	if len(pl.GetIndices()) > 0 {
		return transfer.RunsFromPages(pl.GetIndices())
	}
	runs := make([]transfer.Run, len(pl.GetRuns()))
	for i, r := range pl.GetRuns() {
		runs[i] = transfer.Run{Start: r.GetStart(), Count: r.GetCount()}
	}
	return transfer.Coalesce(runs)
}

// runsFrom returns the positions of runs from position from on, in order
// (all of them when from is not positive).
func runsFrom(runs []transfer.Run, from int64) []transfer.Run {
	if from <= 0 {
		return runs
	}
	var out []transfer.Run
	for _, r := range runs {
		if from >= int64(r.Count) {
			from -= int64(r.Count)
			continue
		}
		out = append(out, transfer.Run{Start: r.Start + int32(from), Count: r.Count - int32(from)})
		from = 0
	}
	return out
}

// bufferSet checks a Send's buffers against a region of nbuf buffers and
// returns them in ascending order, or nil when the Send is for every
// buffer (none named, or all).
func bufferSet(field string, buffers []uint32, nbuf int) ([]int, error) {
	if len(buffers) == 0 {
		return nil, nil
	}
	seen := make([]bool, nbuf)
	for i, b := range buffers {
		if int64(b) >= int64(nbuf) {
			return nil, invalid(fmt.Sprintf("%s[%d]", field, i), "buffer %d, the region has %d (0..%d)", b, nbuf, nbuf-1)
		}
		if seen[b] {
			return nil, invalid(fmt.Sprintf("%s[%d]", field, i), "buffer %d named twice", b)
		}
		seen[b] = true
	}
	if len(buffers) == nbuf {
		return nil, nil
	}
	out := make([]int, 0, len(buffers))
	for b, named := range seen {
		if named {
			out = append(out, b)
		}
	}
	return out, nil
}

func repeatedPageMessage(err error) string {
	if errors.Is(err, transfer.ErrRunsOverlap) {
		return "a page appears twice: " + err.Error()
	}
	return err.Error()
}

// layoutFromProto converts and validates a RegionLayout.
func layoutFromProto(field string, l *pb.RegionLayout) (transfer.Layout, error) {
	if l == nil {
		return transfer.Layout{}, invalid(field, "required")
	}
	if err := conn.ValidateRank(l.Rank); err != nil {
		return transfer.Layout{}, invalid(field+".rank", "%v", err)
	}
	out := transfer.Layout{Rank: transferRank(l.Rank)}
	switch l.Attention {
	case pb.Attention_ATTENTION_UNSPECIFIED:
	case pb.Attention_ATTENTION_MHA:
		out.Attention = rankmap.MHA
	case pb.Attention_ATTENTION_MLA:
		out.Attention = rankmap.MLA
	default:
		return transfer.Layout{}, invalid(field+".attention", "unknown value %d", l.Attention)
	}
	for _, b := range l.Buffers {
		out.Buffers = append(out.Buffers, transfer.BufferSpec{Offset: int64(b.Offset), Length: int64(b.Length), ItemLen: int64(b.ItemLen),
			PageTokens: int64(b.PageTokens), TotalHeads: int64(b.TotalHeads), RankHeads: int64(b.RankHeads), HeadBytes: int64(b.HeadBytes)})
	}
	if l.Aux != nil {
		out.Aux = transfer.AuxSpec{Offset: int64(l.Aux.Offset), RowLen: int64(l.Aux.RowLen), Rows: int64(l.Aux.Rows)}
	}
	if err := out.Validate(); err != nil {
		var fe *transfer.LayoutFieldError
		if errors.As(err, &fe) {
			return transfer.Layout{}, invalid(field+"."+fe.Field, "%s", fe.Desc)
		}
		return transfer.Layout{}, invalid(field, "%v", err)
	}
	return out, nil
}

// One vocabulary, rank, from the proto to the data plane: the proto's Rank
// (tp_rank, tp_size) is Rank on the control plane and transfer.Rank
// in every data-plane key; a completion's rank is poll's Rank index.

// transferRank is a rank conn.ValidateRank accepted; nil or tp_size 0 is rank
// 0 of 1.
func transferRank(r *pb.Rank) transfer.Rank {
	if r == nil || r.TpSize == 0 {
		return transfer.Rank{TP: 0, Size: 1}
	}
	return transfer.Rank{TP: uint16(r.TpRank), Size: uint16(r.TpSize)}
}

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
