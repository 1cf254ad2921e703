package service

import (
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
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
