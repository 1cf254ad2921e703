package service

import (
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// wantField checks err is InvalidArgument and its BadRequest detail names field.
func wantField(t *testing.T, err error, field string) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.InvalidArgument {
		t.Fatalf("got %v, want InvalidArgument", err)
	}
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.FieldViolations {
				if v.Field == field {
					return
				}
			}
		}
	}
	t.Fatalf("%v does not name field %q", err, field)
}

func TestPageListValidation(t *testing.T) {
	const pages = 100
	cases := []struct {
		name  string
		pl    *pb.PageList
		field string
	}{
		{"nil", nil, "pages"},
		{"empty", &pb.PageList{}, "pages"},
		{"both", &pb.PageList{Indices: []int32{1}, Runs: []*pb.PageRun{{Start: 2, Count: 1}}}, "pages"},
		{"negative index", &pb.PageList{Indices: []int32{3, -1}}, "pages.indices[1]"},
		{"index past end", &pb.PageList{Indices: []int32{pages}}, "pages.indices[0]"},
		{"repeated index", &pb.PageList{Indices: []int32{4, 5, 4}}, "pages"},
		{"empty run", &pb.PageList{Runs: []*pb.PageRun{{Start: 1, Count: 0}}}, "pages.runs[0]"},
		{"run past end", &pb.PageList{Runs: []*pb.PageRun{{Start: 90, Count: 11}}}, "pages.runs[0]"},
		{"overlapping runs", &pb.PageList{Runs: []*pb.PageRun{{Start: 0, Count: 5}, {Start: 4, Count: 2}}}, "pages"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := pageRuns("pages", c.pl, pages)
			wantField(t, err, c.field)
		})
	}
}

func TestPageListKeepsOrderAndCoalesces(t *testing.T) {
	runs, err := pageRuns("pages", &pb.PageList{Indices: []int32{7, 8, 9, 2, 3}}, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []transfer.Run{{Start: 7, Count: 3}, {Start: 2, Count: 2}}
	if len(runs) != len(want) || runs[0] != want[0] || runs[1] != want[1] {
		t.Fatalf("runs %v, want %v", runs, want)
	}
	runs, err = pageRuns("pages", &pb.PageList{Runs: []*pb.PageRun{{Start: 0, Count: 2}, {Start: 2, Count: 3}}}, 10)
	if err != nil || len(runs) != 1 || runs[0] != (transfer.Run{Start: 0, Count: 5}) {
		t.Fatalf("runs %v %v, want one run of 5", runs, err)
	}
}

func TestBatchAndRoomIDValidation(t *testing.T) {
	wantField(t, validateBatch("room_ids", nil), "room_ids")
	wantField(t, validateBatch("room_ids", []uint64{1, 0}), "room_ids[1]")
	wantField(t, validateBatch("room_ids", []uint64{1 << 63}), "room_ids[0]")
	if err := validateBatch("room_ids", []uint64{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	wantField(t, validateRank("rank", &pb.Rank{TpRank: 2, TpSize: 2}), "rank")
	if err := validateRank("rank", &pb.Rank{TpRank: 1, TpSize: 2}); err != nil {
		t.Fatal(err)
	}
}

func TestLayoutValidation(t *testing.T) {
	_, err := layoutFromProto("layout", nil)
	wantField(t, err, "layout")
	_, err = layoutFromProto("layout", &pb.RegionLayout{Buffers: []*pb.BufferSpec{{Offset: 0, Length: 100, ItemLen: 0}}})
	wantField(t, err, "layout")
	l, err := layoutFromProto("layout", &pb.RegionLayout{
		Rank:    &pb.Rank{TpRank: 1, TpSize: 2},
		Buffers: []*pb.BufferSpec{{Offset: 0, Length: 4096, ItemLen: 1024}, {Offset: 4096, Length: 4096, ItemLen: 1024}},
		Aux:     &pb.AuxSpec{Offset: 8192, RowLen: 64, Rows: 4},
	})
	if err != nil {
		t.Fatal(err)
	}
	if l.Rank != (transfer.Rank{TP: 1, Size: 2}) || len(l.Buffers) != 2 || l.Buffers[1].Pages() != 4 {
		t.Fatalf("layout %+v", l)
	}
}
