package service

import (
	"fmt"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pdlink/pdlink/pkg/room"
)

// A head slice the data plane refused reaches the scheduler as its own
// code with a readable reason, never as Internal or as a generic transfer
// refusal: one outside its row is the caller's (InvalidArgument,
// bad_slice), one the mapping does not give the pair is the two layouts'
// disagreement (FailedPrecondition, slice_mismatch).
func TestHeadSliceRefusalsMapToTheirCodeAndReason(t *testing.T) {
	for _, tc := range []struct {
		err    error
		code   codes.Code
		reason string
	}{
		{fmt.Errorf("%w: buffer 0 copy", room.ErrBadHeadSlice), codes.InvalidArgument, "bad_slice"},
		{fmt.Errorf("%w: heads 2+2", room.ErrHeadSliceMismatch), codes.FailedPrecondition, "slice_mismatch"},
	} {
		st := status.Convert(toStatus(tc.err))
		if st.Code() != tc.code {
			t.Errorf("%v: code %v, want %v", tc.err, st.Code(), tc.code)
		}
		var got string
		for _, d := range st.Details() {
			if info, ok := d.(*errdetails.ErrorInfo); ok && info.Reason == "HEAD_SLICE_REFUSED" {
				got = info.Metadata["reason"]
			}
		}
		if got != tc.reason {
			t.Errorf("%v: ErrorInfo reason %q, want %q", tc.err, got, tc.reason)
		}
	}
}
