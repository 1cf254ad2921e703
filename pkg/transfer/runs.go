package transfer

import (
	"fmt"
	"slices"
)

// Run is Count consecutive pages starting at page Start of one buffer.
type Run struct {
	Start int32
	Count int32
}

// end returns one past the run's last page, in int64 so it cannot overflow.
func (r Run) end() int64 { return int64(r.Start) + int64(r.Count) }

// RunsFromPages turns a page index list into runs, merging consecutive indices. Order is
// kept: the k-th page of a source list goes to the k-th page of its destination list.
func RunsFromPages(pages []int32) []Run {
	var out []Run
	for _, p := range pages {
		if n := len(out); n > 0 && out[n-1].end() == int64(p) && out[n-1].Count < 1<<31-1 {
			out[n-1].Count++
			continue
		}
		out = append(out, Run{Start: p, Count: 1})
	}
	return out
}

// Coalesce merges adjacent runs where one ends where the next starts, keeping order. It
// returns a new slice.
func Coalesce(runs []Run) []Run {
	out := make([]Run, 0, len(runs))
	for _, r := range runs {
		if n := len(out); n > 0 && out[n-1].end() == int64(r.Start) && int64(out[n-1].Count)+int64(r.Count) < 1<<31 {
			out[n-1].Count += r.Count
			continue
		}
		out = append(out, r)
	}
	return out
}

// CountPages is the number of pages in runs.
func CountPages(runs []Run) int64 {
	var n int64
	for _, r := range runs {
		n += int64(r.Count)
	}
	return n
}

// ValidateRuns checks that every run is non-empty and inside [0, pages), and that no page
// appears twice.
func ValidateRuns(runs []Run, pages int64) error {
	for _, r := range runs {
		if r.Count <= 0 || r.Start < 0 {
			return fmt.Errorf("%w: run {start %d, count %d}", ErrEmptyRun, r.Start, r.Count)
		}
		if r.end() > pages {
			return fmt.Errorf("%w: run {start %d, count %d} past %d pages", ErrPageOutOfRange, r.Start, r.Count, pages)
		}
	}
	if len(runs) < 2 {
		return nil
	}
	s := slices.Clone(runs)
	slices.SortFunc(s, func(a, b Run) int { return int(a.Start) - int(b.Start) })
	for i := 1; i < len(s); i++ {
		if int64(s[i].Start) < s[i-1].end() {
			return fmt.Errorf("%w: page %d", ErrRunsOverlap, s[i].Start)
		}
	}
	return nil
}

// Segment pairs Count consecutive source pages from Src with Count consecutive destination
// pages from Dst.
type Segment struct {
	Src, Dst, Count int32
}

// Pair walks src and dst page lists in step and returns maximal segments in which both sides
// are consecutive. It fails with ErrRunsMismatch if the lists hold different page counts.
func Pair(src, dst []Run) ([]Segment, error) {
	if a, b := CountPages(src), CountPages(dst); a != b {
		return nil, fmt.Errorf("%w: %d source pages, %d destination pages", ErrRunsMismatch, a, b)
	}
	var out []Segment
	si, di := 0, 0
	var so, do int32 // offsets consumed within src[si], dst[di]
	for si < len(src) && di < len(dst) {
		s, d := src[si], dst[di]
		n := min(s.Count-so, d.Count-do)
		seg := Segment{Src: s.Start + so, Dst: d.Start + do, Count: n}
		if k := len(out); k > 0 {
			p := &out[k-1]
			if p.Src+p.Count == seg.Src && p.Dst+p.Count == seg.Dst && int64(p.Count)+int64(n) < 1<<31 {
				p.Count += n
				seg.Count = 0
			}
		}
		if seg.Count > 0 {
			out = append(out, seg)
		}
		so += n
		do += n
		if so == s.Count {
			si, so = si+1, 0
		}
		if do == d.Count {
			di, do = di+1, 0
		}
	}
	return out, nil
}

// SamePages returns n references to runs, for the common case where every buffer (every
// layer's K and V) uses the same page indices. The runs are shared, not copied.
func SamePages(n int, runs []Run) [][]Run {
	out := make([][]Run, n)
	for i := range out {
		out[i] = runs
	}
	return out
}
