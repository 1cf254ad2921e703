package pagelist

import (
	"fmt"
	"math"
	"os"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// TestIndexBytesIsTheProtobufSize: IndexBytes must agree with protobuf's own varint sizes,
// or the bound it enforces is not the frame's.
func TestIndexBytesIsTheProtobufSize(t *testing.T) {
	for _, p := range []int32{0, 1, 127, 128, 1<<14 - 1, 1 << 14, 1<<21 - 1, 1 << 21, 1<<28 - 1, 1 << 28, math.MaxInt32, -1, math.MinInt32} {
		want := protowire.SizeVarint(uint64(int64(p)))
		if got := IndexBytes([]int32{p}); got != want {
			t.Errorf("IndexBytes(%d) = %d, protobuf encodes it in %d", p, got, want)
		}
	}
}

// TestRunsAndSmallIndicesFitTheByteBound: the byte bound is only measured for indices
// because MaxRuns runs of the largest encoding fit under it, and MaxPages indices must fit
// when page numbers are below 2^21.
func TestRunsAndSmallIndicesFitTheByteBound(t *testing.T) {
	if MaxRuns*maxRunBytes > MaxListBytes {
		t.Errorf("%d runs take up to %d bytes, over MaxListBytes %d", MaxRuns, MaxRuns*maxRunBytes, MaxListBytes)
	}
	if n := MaxPages * protowire.SizeVarint(1<<21-1); n > MaxListBytes {
		t.Errorf("%d indices below 2^21 take %d bytes, over MaxListBytes %d", MaxPages, n, MaxListBytes)
	}
}

// TestProtoDocumentsTheseBounds: the PageList comment in common.proto is what scheduler
// authors read; it must state the bounds this package enforces.
func TestProtoDocumentsTheseBounds(t *testing.T) {
	b, err := os.ReadFile("../../api/pdlink/v1/common.proto")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf("at most %d pages", MaxPages),
		fmt.Sprintf("at most %d runs", MaxRuns),
		fmt.Sprintf("at most %d KiB", MaxListBytes>>10),
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("common.proto does not say %q", want)
		}
	}
}
