package sim

import (
	"context"
	"math"
	"testing"
	"time"
)

// The prefill scheduler starts its Sends at decode's prefix (the position
// its room's status reports): the chunks the prefix covers send nothing,
// the chunk it ends in sends from it on, each Send still after its chunk's
// forward pass (the prefill computes every token); what it handed over is
// the pages after the prefix, each in every buffer. A room decode holds
// whole is one last Send of no pages, after the last pass, for the aux row.
func TestPrefillSendsOnlyThePagesAfterDecodesPrefix(t *testing.T) {
	ms := func(x float64) time.Duration { return time.Duration(math.Round(x * float64(time.Millisecond))) }
	// 1000 tokens on 16-token pages: 63 pages, chunks of 16, 16, 16 and 15
	// pages whose passes end at 12.8, 25.6, 38.4 and 50 ms.
	rq := request{room: 1, tokens: 1000, pages: 63}
	for _, c := range []struct {
		name  string
		from  int
		want  []sentChunk
		pages int64
	}{
		{"inside a chunk", 20, []sentChunk{
			{at: ms(25.6), start: 20, pages: 12, first: 20},
			{at: ms(38.4), start: 32, pages: 16, first: 32},
			{at: ms(50.0), start: 48, pages: 15, last: true, first: 48},
		}, 43},
		{"on a chunk boundary", 32, []sentChunk{
			{at: ms(38.4), start: 32, pages: 16, first: 32},
			{at: ms(50.0), start: 48, pages: 15, last: true, first: 48},
		}, 31},
		{"every position", 63, []sentChunk{{at: ms(50.0), start: 63, pages: 0, last: true, first: -1}}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			r, pre, _ := pacedRun(20000)
			sent := r.sendChunks(context.Background(), rq, [][]int32{pagesOf(63)}, []int32{0}, c.from)
			if sent.first.IsZero() || sent.last.IsZero() {
				t.Fatalf("sendChunks = %v, %v: want both times", sent.first, sent.last)
			}
			if len(pre.sends) != len(c.want) {
				t.Fatalf("from %d sent %+v, want %+v", c.from, pre.sends, c.want)
			}
			for i, w := range c.want {
				if pre.sends[i] != w {
					t.Errorf("Send %d: %+v, want %+v", i, pre.sends[i], w)
				}
			}
			if sent.pages[0] != c.pages {
				t.Errorf("handed over %d positions, want %d", sent.pages[0], c.pages)
			}
		})
	}
}

// Layer-wise, each position after the prefix goes once per layer (a Send
// naming its K and V buffers): one position handed over, a page of each
// buffer.
func TestLayerWisePrefillCountsAPositionOnceAndEachBuffersPage(t *testing.T) {
	r, pre, _ := pacedRun(0)
	r.cfg.LayerWise = true
	sent := r.sendChunks(context.Background(), request{room: 1, tokens: 1000, pages: 63}, [][]int32{pagesOf(63)}, []int32{0}, 40)
	layers := r.cfg.Layout.Layers
	if len(pre.sends) != 2*layers { // chunks [40,48) and [48,63), a Send per layer each
		t.Fatalf("%d Sends, want %d", len(pre.sends), 2*layers)
	}
	for i, s := range pre.sends {
		if want := uint32(40 + 8*(i/layers)); s.start != want || s.buffers != 2 {
			t.Errorf("Send %d: %+v, want position %d naming 2 buffers", i, s, want)
		}
	}
	if sent.pages[0] != 23 {
		t.Errorf("handed over %d positions, want 23 (each once, whatever its layers)", sent.pages[0])
	}
}
