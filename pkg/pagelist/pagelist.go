// Package pagelist holds the bounds on one page list, defined once for the three trust
// boundaries that check a page list: a scheduler's call (gRPC in, internal/service), a
// peer's METADATA frame (frame in, pkg/conn) and a data chunk (chunk in, pkg/transfer).
// Because every boundary applies the same bounds, a list the scheduler's daemon accepts is
// never refused by its peer for its size. The package imports nothing, so all three can use
// it.
package pagelist

import "math/bits"

const (
	// MaxPages bounds the pages one page list names: its indices, or the sum of its runs'
	// counts. Also the most pages one data chunk may carry (a chunk names pages of one list).
	MaxPages = 1 << 18
	// MaxRuns bounds the runs of one page list, and of one data chunk's run list.
	MaxRuns = 1 << 16
	// MaxListBytes bounds a list's protobuf encoding, so that a METADATA carrying it fits one
	// control frame (1 MiB) with room for the rest of the frame. MaxPages indices below 2^21
	// (three bytes each) fit, as do MaxRuns runs of any value; MaxPages larger page numbers
	// would not, and are refused where the scheduler can still send them as runs.
	MaxListBytes = 960 << 10
)

// maxRunBytes is the largest encoding of one run in a list: a field tag and a length byte,
// then start and count, each a one-byte tag and a varint of at most five bytes.
const maxRunBytes = 2 + 2*(1+5)

// IndexBytes returns the size of indices as a packed protobuf varint field's payload. A
// list of runs always fits MaxListBytes, so only a list of indices needs measuring. A negative index counts as ten bytes, as protobuf encodes it.
func IndexBytes(indices []int32) int {
	n := 0
	for _, p := range indices {
		if p < 0 {
			n += 10
			continue
		}
		n += (bits.Len32(uint32(p)|1) + 6) / 7
	}
	return n
}
