package transfer

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"pgregory.net/rapid"
)

const (
	propPages   = 96
	propItemLen = 512
	propBuffers = 2
)

// pageList draws a list of distinct pages of one of three shapes: consecutive, scattered,
// or whole blocks in random order.
func pageList(t *rapid.T, label string, n int) []int32 {
	all := make([]int32, propPages)
	for i := range all {
		all[i] = int32(i)
	}
	switch rapid.IntRange(0, 2).Draw(t, label+"_shape") {
	case 0: // one consecutive run
		base := rapid.IntRange(0, propPages-n).Draw(t, label+"_base")
		return all[base : base+n]
	case 1: // scattered
		return rapid.Permutation(all).Draw(t, label+"_perm")[:n]
	default: // blocks of 8 consecutive pages in random order
		blocks := rapid.Permutation([]int32{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}).Draw(t, label+"_blocks")
		var out []int32
		for _, b := range blocks {
			for p := b * 8; p < b*8+8 && len(out) < n; p++ {
				out = append(out, p)
			}
		}
		return out
	}
}

// TestPropertyRandomPageListsArriveIntact transfers random page lists (consecutive runs,
// scattered pages, blocks) and checks that every destination byte equals its source page and
// every other destination byte still holds the sentinel. A source list with a repeated page
// or a page out of range is refused by Send with a clear error and nothing is written; such a
// destination list is refused by the receiver on the chunk that names the bad page: the room
// fails with reason invalid and no byte lands outside the room's destination pages.
func TestPropertyRandomPageListsArriveIntact(t *testing.T) {
	l := UniformLayout(propBuffers, propPages, propItemLen, 4, 32)
	g := newRig(t, l, l, false, SenderConfig{MaxChunkBytes: 4 * propItemLen}, ReceiverConfig{PieceBytes: 4096})
	var room uint64
	rapid.Check(t, func(rt *rapid.T) {
		room++
		k := Key{Room: room, Nonce: 1}
		n := rapid.IntRange(1, 40).Draw(rt, "n")
		src := pageList(rt, "src", n)
		dst := pageList(rt, "dst", n)
		for b := 0; b < propBuffers; b++ {
			fill(g.src.Buffer(b), room*7+uint64(b))
			memset(g.dst.Buffer(b), 0xAA)
		}
		memset(g.dst.AuxRow(int64(room%4)), 0xAA)
		before := snapshot(g.dst)

		bad := rapid.IntRange(0, 5).Draw(rt, "bad") // 0: repeat, 1: out of range, else valid
		var wantErr error
		onSrc := rapid.Bool().Draw(rt, "on_src") // which side carries the bad page
		src, dst = append([]int32(nil), src...), append([]int32(nil), dst...)
		bad1, good1 := &dst, &src
		if onSrc {
			bad1, good1 = &src, &dst
		}
		switch bad {
		case 0:
			wantErr = ErrRunsOverlap
			*bad1 = append(*bad1, (*bad1)[rapid.IntRange(0, n-1).Draw(rt, "dup")])
			*good1 = append(*good1, firstUnused(*good1))
		case 1:
			wantErr = ErrPageOutOfRange
			*bad1 = append(*bad1, propPages+int32(rapid.IntRange(0, 5).Draw(rt, "over")))
			*good1 = append(*good1, firstUnused(*good1))
		}
		srcRuns, dstRuns := RunsFromPages(src), RunsFromPages(dst)
		aux := bytes.Repeat([]byte{byte(room)}, 32)

		expErr := g.rcv.Expect(Expectation{Key: k, Dst: SamePages(propBuffers, dstRuns), AuxRow: int64(room % 4)})
		if expErr != nil {
			rt.Fatalf("Expect: %v", expErr) // destination lists are checked by the caller's edge and per chunk
		}
		if wantErr != nil && onSrc {
			defer g.rcv.Fence(k)
			done := make(chan error, 1)
			err := g.snd.Send(t.Context(), SendRequest{Peer: g.addr, Key: k, Src: SamePages(propBuffers, srcRuns),
				Dst: SamePages(propBuffers, dstRuns), Aux: aux, Done: func(err error) { done <- err }})
			if !errors.Is(err, wantErr) || err.Error() == wantErr.Error() {
				rt.Fatalf("Send: got %v, want %v with detail", err, wantErr)
			}
			if !bytes.Equal(before, snapshot(g.dst)) {
				rt.Fatal("refused request wrote to destination memory")
			}
			return
		}
		if wantErr != nil {
			// A bad destination list reaches the receiver: the chunk naming the bad page is
			// refused before a byte of it lands, and the room fails with reason invalid.
			err := waitDone(t, g.send(t, k, SamePages(propBuffers, srcRuns), SamePages(propBuffers, dstRuns), aux))
			if ReasonOf(err) != ReasonInvalid {
				rt.Fatalf("done: got %v, want reason invalid", err)
			}
			if r := g.ev.wait(t, k); r != ReasonInvalid {
				rt.Fatalf("receiver outcome %q, want invalid", r)
			}
			g.rcv.Fence(k)
			inDst := map[int32]bool{}
			for _, d := range dst {
				inDst[d] = true
			}
			for b := 0; b < propBuffers; b++ {
				for p := int32(0); p < propPages; p++ {
					if !inDst[p] && !bytes.Equal(g.dst.Pages(b, Run{p, 1}), bytes.Repeat([]byte{0xAA}, propItemLen)) {
						rt.Fatalf("buffer %d page %d: written but not a destination", b, p)
					}
				}
			}
			if aux[0] != 0xAA && bytes.Equal(g.dst.AuxRow(int64(room%4)), aux) {
				rt.Fatal("aux row written for a failed room")
			}
			return
		}
		if err := waitDone(t, g.send(t, k, SamePages(propBuffers, srcRuns), SamePages(propBuffers, dstRuns), aux)); err != nil {
			rt.Fatalf("done: %v", err)
		}
		if r := g.ev.wait(t, k); r != "" {
			rt.Fatalf("receiver outcome %q", r)
		}
		g.rcv.Fence(k)
		isDst := map[int32]int32{}
		for i, d := range dst {
			isDst[d] = src[i]
		}
		for b := 0; b < propBuffers; b++ {
			for p := int32(0); p < propPages; p++ {
				got := g.dst.Pages(b, Run{p, 1})
				if s, ok := isDst[p]; ok {
					if !bytes.Equal(got, g.src.Pages(b, Run{s, 1})) {
						rt.Fatalf("buffer %d page %d: not equal to source page %d", b, p, s)
					}
				} else if !bytes.Equal(got, bytes.Repeat([]byte{0xAA}, propItemLen)) {
					rt.Fatalf("buffer %d page %d: written but not a destination", b, p)
				}
			}
		}
		if !bytes.Equal(g.dst.AuxRow(int64(room%4)), aux) {
			rt.Fatal("aux row not written")
		}
	})
}

func firstUnused(pages []int32) int32 {
	used := map[int32]bool{}
	for _, p := range pages {
		used[p] = true
	}
	for p := int32(0); ; p++ {
		if !used[p] {
			return p
		}
	}
}

func snapshot(r *Region) []byte {
	var out []byte
	for i := range r.Layout().Buffers {
		out = append(out, r.Buffer(i)...)
	}
	for row := int64(0); row < r.Layout().Aux.Rows; row++ {
		out = append(out, r.AuxRow(row)...)
	}
	return out
}

func TestRunHelpers(t *testing.T) {
	if got := RunsFromPages([]int32{3, 4, 5, 9, 1, 2}); fmt.Sprint(got) != "[{3 3} {9 1} {1 2}]" {
		t.Fatalf("RunsFromPages: %v", got)
	}
	if got := Coalesce([]Run{{0, 2}, {2, 3}, {7, 1}, {8, 1}, {3, 1}}); fmt.Sprint(got) != "[{0 5} {7 2} {3 1}]" {
		t.Fatalf("Coalesce: %v", got)
	}
	segs, err := Pair([]Run{{0, 4}, {10, 2}}, []Run{{20, 2}, {22, 1}, {50, 3}})
	if err != nil || fmt.Sprint(segs) != "[{0 20 3} {3 50 1} {10 51 2}]" {
		t.Fatalf("Pair: %v %v", segs, err)
	}
	if _, err := Pair([]Run{{0, 4}}, []Run{{0, 3}}); !errors.Is(err, ErrRunsMismatch) {
		t.Fatalf("Pair mismatch: %v", err)
	}
	for _, c := range []struct {
		runs []Run
		want error
	}{
		{[]Run{{0, 0}}, ErrEmptyRun},
		{[]Run{{-1, 2}}, ErrEmptyRun},
		{[]Run{{9, 2}}, ErrPageOutOfRange},
		{[]Run{{2147483647, 1}}, ErrPageOutOfRange},
		{[]Run{{0, 3}, {2, 1}}, ErrRunsOverlap},
		{[]Run{{5, 1}, {0, 5}}, nil},
	} {
		if err := ValidateRuns(c.runs, 10); !errors.Is(err, c.want) || (c.want == nil && err != nil) {
			t.Errorf("ValidateRuns(%v) = %v, want %v", c.runs, err, c.want)
		}
	}
}
