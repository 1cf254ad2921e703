package room

import (
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/pdlink/pdlink/pkg/transfer"
)

// Whatever Sends a scheduler tries (any buffers, starts inside or past
// decode's prefix, chunks of any size), the positions a room accepts move
// each buffer's pages from prefix_len on exactly once and in order, so the
// k-th page appended to a buffer is its (prefix+k)-th destination position
// (the stream's Dst contract), and a last Send is accepted exactly when
// every buffer then has every position.
func TestAcceptedSendsMoveEachBuffersPositionsAboveThePrefixOnceInOrder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		nbuf := rapid.IntRange(1, 4).Draw(t, "buffers")
		dst := int64(rapid.IntRange(0, 12).Draw(t, "positions"))
		prefix := int64(rapid.IntRange(0, int(dst)).Draw(t, "prefix"))
		r := &prefillRoom{dstPages: dst, prefix: prefix}
		moved := make([][]int64, nbuf) // per buffer, the positions whose bytes moved, in order
		for range rapid.IntRange(0, 30).Draw(t, "sends") {
			var buffers []int
			if rapid.Bool().Draw(t, "subset") {
				buffers = rapid.SliceOfNDistinct(rapid.IntRange(0, nbuf-1), 1, nbuf, rapid.ID[int]).Draw(t, "named")
				slices.Sort(buffers)
				if len(buffers) == nbuf {
					buffers = nil // bufferSet's normal form
				}
			}
			base := r.nextPosition(0)
			if buffers != nil {
				base = r.nextPosition(buffers[0])
			}
			start := max(0, base+int64(rapid.IntRange(-1, 3).Draw(t, "skew")))
			n := int64(rapid.IntRange(0, 5).Draw(t, "pages"))
			last := rapid.Bool().Draw(t, "last")
			// The source page of position p is page p: what moves names
			// the positions themselves.
			var src []transfer.Run
			if n > 0 {
				src = []transfer.Run{{Start: int32(start), Count: int32(n)}}
			}
			complete := true
			for b := range nbuf {
				end := r.nextPosition(b)
				if buffers == nil || slices.Contains(buffers, b) {
					end = start + n
				}
				complete = complete && end == dst
			}
			err := r.checkPositions(start, n, buffers, nbuf, last)
			if err == nil && last && !complete {
				t.Fatalf("a last Send accepted with a buffer short of %d positions", dst)
			}
			if err != nil {
				continue
			}
			named(buffers, nbuf, func(b int) bool {
				for _, run := range r.moved(start, src) {
					for p := range int64(run.Count) {
						moved[b] = append(moved[b], int64(run.Start)+p)
					}
				}
				return true
			})
			r.advance(buffers, nbuf, start+n)
			if last {
				break
			}
		}
		for b := range nbuf {
			want := []int64{}
			for p := prefix; p < max(prefix, r.nextPosition(b)); p++ {
				want = append(want, p)
			}
			if got := append([]int64{}, moved[b]...); !slices.Equal(got, want) {
				t.Fatalf("buffer %d moved positions %v, want %v (prefix %d, next %d)", b, got, want, prefix, r.nextPosition(b))
			}
		}
	})
}
