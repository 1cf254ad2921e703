package sim

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/pdlink/pdlink/pkg/rankmap"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// Layout is the simulated model's KV layout.
type Layout struct {
	Layers        int   // K and V buffers per layer
	PageTokens    int   // tokens per page
	BytesPerToken int64 // KV bytes per token across all buffers
	Pages         int64 // pages per buffer in each region
	AuxRows       int64
	AuxRowLen     int64
	// HeadDim and DtypeBytes describe each buffer's token row as KV heads of HeadDim
	// elements of DtypeBytes bytes (RegionLayout's head fields, MHA, the heads being what
	// the row holds): 0 leaves the layout opaque.
	HeadDim    int
	DtypeBytes int
	// MLA makes the attention MLA: one latent per token that every TP rank holds whole
	// (DeepSeek-style), instead of MHA's heads split over the ranks.
	MLA bool
}

// DemoLayout is a realistic 8B-class model: 32 layers, K and V, 16-token
// pages, 128 KiB of KV per token: 8 KV heads of 128 bf16 values per buffer
// (Llama-3-8B).
func DemoLayout() Layout {
	return Layout{Layers: 32, PageTokens: 16, BytesPerToken: 128 << 10, Pages: 512, AuxRows: 256, AuxRowLen: 64,
		HeadDim: 128, DtypeBytes: 2}
}

// TestLayout is small enough for unit and e2e tests: 4 KV heads of 128
// bf16 values per buffer.
func TestLayout() Layout {
	return Layout{Layers: 2, PageTokens: 16, BytesPerToken: 4 << 10, Pages: 256, AuxRows: 128, AuxRowLen: 64,
		HeadDim: 128, DtypeBytes: 2}
}

// HeadsFit reports whether a buffer's token row (BytesPerToken over the
// buffers) is whole heads of HeadDim x DtypeBytes bytes; an opaque layout
// fits.
func (l Layout) HeadsFit() bool {
	if l.HeadDim == 0 {
		return true
	}
	buffers := int64(2 * l.Layers)
	hb := int64(l.HeadDim) * int64(l.DtypeBytes)
	return buffers > 0 && hb > 0 && l.BytesPerToken%buffers == 0 && l.BytesPerToken/buffers%hb == 0
}

// Transfer returns the region layout of the model on TP rank 0 of 1.
func (l Layout) Transfer() (transfer.Layout, error) { return l.RankTransfer(0, 1) }

// RankTransfer returns the region layout TP rank rank of a size-rank engine maps. The model's
// KV (BytesPerToken) is split as its attention splits it: MHA gives each rank its heads
// (max(heads/size, 1), SGLang's kv_head_num), MLA gives every rank the whole latent, and an
// opaque layout gives each rank an equal share of the token row.
func (l Layout) RankTransfer(rank, size int) (transfer.Layout, error) {
	buffers := 2 * l.Layers
	if buffers < 1 || l.PageTokens < 1 || l.BytesPerToken < int64(buffers) || l.Pages < 1 {
		return transfer.Layout{}, fmt.Errorf("sim: bad layout %+v", l)
	}
	if size < 1 || size > rankmap.MaxTP || rank < 0 || rank >= size {
		return transfer.Layout{}, fmt.Errorf("sim: tp rank %d of %d, want a size of 1..%d", rank, size, rankmap.MaxTP)
	}
	row := l.BytesPerToken / int64(buffers) // one token of one buffer, every head
	var tl transfer.Layout
	switch {
	case l.HeadDim == 0 && l.MLA:
		return transfer.Layout{}, fmt.Errorf("sim: an mla layout needs its head shape (head dim and dtype bytes)")
	case l.HeadDim == 0:
		if row%int64(size) != 0 {
			return transfer.Layout{}, fmt.Errorf("sim: an opaque token row of %d bytes does not split over tp %d", row, size)
		}
		tl = transfer.UniformLayout(buffers, l.Pages, row/int64(size)*int64(l.PageTokens), l.AuxRows, l.AuxRowLen)
	default:
		if l.HeadDim < 0 || l.DtypeBytes < 1 || !l.HeadsFit() {
			return transfer.Layout{}, fmt.Errorf("sim: %d KV bytes per token over %d buffers is not whole heads of %d x %d bytes",
				l.BytesPerToken, buffers, l.HeadDim, l.DtypeBytes)
		}
		hb := int64(l.HeadDim) * int64(l.DtypeBytes)
		heads := row / hb
		attention, rankHeads := rankmap.MHA, max(heads/int64(size), 1)
		if l.MLA {
			attention, rankHeads = rankmap.MLA, heads
		}
		tl = transfer.UniformLayout(buffers, l.Pages, rankHeads*hb*int64(l.PageTokens), l.AuxRows, l.AuxRowLen)
		tl.Rank = transfer.Rank{TP: uint16(rank), Size: uint16(size)}
		tl = tl.WithHeads(attention, int64(l.PageTokens), heads, hb)
	}
	tl.Rank = transfer.Rank{TP: uint16(rank), Size: uint16(size)}
	return tl, tl.Validate()
}

// allocator hands out page indices; it returns scattered pages once the
// free list has been churned, like a real engine's.
type allocator struct {
	mu   sync.Mutex
	free []int32
	cond *sync.Cond
}

func newAllocator(n int64) *allocator {
	a := &allocator{}
	a.cond = sync.NewCond(&a.mu)
	for i := n - 1; i >= 0; i-- {
		a.free = append(a.free, int32(i))
	}
	return a
}

// alloc blocks until n pages are free (n must not exceed the total).
func (a *allocator) alloc(n int, stop <-chan struct{}) ([]int32, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for len(a.free) < n {
		select {
		case <-stop:
			return nil, false
		default:
		}
		a.cond.Wait()
	}
	out := make([]int32, n)
	copy(out, a.free[len(a.free)-n:])
	a.free = a.free[:len(a.free)-n]
	return out, true
}

func (a *allocator) release(p []int32) {
	a.mu.Lock()
	a.free = append(a.free, p...)
	a.mu.Unlock()
	a.cond.Broadcast()
}

// wakeAll wakes every waiter so it can see its stop channel closed. The
// broadcast happens under the lock so a waiter between its stop check and
// Wait cannot miss it.
func (a *allocator) wakeAll() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.cond.Broadcast()
}

// pattern fills or checks a page: every 8-byte word holds a value derived
// from the room, the buffer, the page's position in the room and the word,
// so a page that lands in the wrong place, or half a page, is caught.
func patternWord(room uint64, buf, pos int, word int) uint64 {
	return room*0x9E3779B97F4A7C15 ^ uint64(buf)<<48 ^ uint64(pos)<<24 ^ uint64(word)
}

func fillPage(p []byte, room uint64, buf, pos int) {
	for w := 0; w+8 <= len(p); w += 8 {
		binary.LittleEndian.PutUint64(p[w:], patternWord(room, buf, pos, w/8))
	}
}

// sentinel marks a decode page as not yet written.
const sentinel = 0xA5

func fillSentinel(p []byte) {
	for i := range p {
		p[i] = sentinel
	}
}

func isSentinel(p []byte) bool {
	for _, b := range p {
		if b != sentinel {
			return false
		}
	}
	return true
}

func runOf(p int32) transfer.Run { return transfer.Run{Start: p, Count: 1} }
