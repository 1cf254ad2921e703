package room

import (
	"errors"
	"fmt"
	"testing"

	"github.com/pdlink/pdlink/pkg/transfer"
)

// The data plane's head-slice refusals keep their chain under this
// package's sentinels, which the service edge maps; other refusals are not
// taken for them.
func TestHeadSliceErrorsKeepTheirKind(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error
	}{
		{fmt.Errorf("open: %w", transfer.ErrBadSlice), ErrBadHeadSlice},
		{fmt.Errorf("expect: %w", transfer.ErrSliceMismatch), ErrHeadSliceMismatch},
		{transfer.ErrRunsMismatch, nil},
	} {
		got := headSliceError(tc.err)
		if tc.want == nil {
			if got != nil {
				t.Errorf("%v: %v, want nil", tc.err, got)
			}
			continue
		}
		if !errors.Is(got, tc.want) || !errors.Is(got, tc.err) {
			t.Errorf("%v: %v, want %v wrapping it", tc.err, got, tc.want)
		}
	}
}
