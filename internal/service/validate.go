package service

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/pagelist"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/transfer"
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

func validateRank(field string, r *pb.Rank) error {
	if r == nil {
		return nil // rank 0 of 1
	}
	if r.TpSize == 0 && r.TpRank == 0 {
		return nil
	}
	if r.TpSize < 1 || r.TpRank >= r.TpSize {
		return invalid(field, "tp_rank %d must be below tp_size %d", r.TpRank, r.TpSize)
	}
	if r.TpSize > poll.MaxRanks {
		return invalid(field, "tp_size %d: at most %d", r.TpSize, poll.MaxRanks)
	}
	return nil
}

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
	if err := validateRank(field+".rank", l.Rank); err != nil {
		return transfer.Layout{}, err
	}
	out := transfer.Layout{Rank: rankFromProto(l.Rank)}
	for _, b := range l.Buffers {
		out.Buffers = append(out.Buffers, transfer.BufferSpec{Offset: int64(b.Offset), Length: int64(b.Length), ItemLen: int64(b.ItemLen)})
	}
	if l.Aux != nil {
		out.Aux = transfer.AuxSpec{Offset: int64(l.Aux.Offset), RowLen: int64(l.Aux.RowLen), Rows: int64(l.Aux.Rows)}
	}
	if err := out.Validate(); err != nil {
		return transfer.Layout{}, invalid(field, "%v", err)
	}
	return out, nil
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

func isClosed(err error) bool { return errors.Is(err, net.ErrClosed) }
