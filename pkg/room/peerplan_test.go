package room

import (
	"testing"

	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/rankmap"
	"github.com/pdlink/pdlink/pkg/transfer"
)

func demoLayout(headBytes int64) transfer.Layout {
	// 64 buffers of 16-token pages of 8 heads (the demo's 8B-class model).
	return transfer.UniformLayout(64, 512, 16*8*headBytes, 256, 64).WithHeads(rankmap.MHA, 16, 8, headBytes)
}

// TestPeerPlanIsRedoneWhenThePeerLayoutChanges: the plan is kept per peer and pair of
// layouts; a peer that re-registers a layout that maps is bound again, and counted refused
// once per refused layout.
func TestPeerPlanIsRedoneWhenThePeerLayoutChanges(t *testing.T) {
	var p peerPlans
	log := zap.NewNop()
	local := demoLayout(256)
	const addr = "127.0.0.1:7000"
	for range 3 {
		if err := p.plan(log, addr, local, demoLayout(128)); err == nil {
			t.Fatal("a peer with half the head bytes was not refused")
		}
	}
	if n := p.refusals("dtype"); n != 1 {
		t.Fatalf("refused %d times for dtype, want once per pair of layouts", n)
	}
	if _, ok := p.mapping(addr); ok {
		t.Fatal("a refused peer has a mapping")
	}
	if err := p.plan(log, addr, local, demoLayout(256)); err != nil {
		t.Fatalf("the peer's new layout: %v", err)
	}
	if m, ok := p.mapping(addr); !ok || !m.Identity() {
		t.Fatalf("mapping %+v %v, want the identity", m, ok)
	}
	if l := p.list(); len(l) != 1 || l[0].Refused != "" || !l[0].Described {
		t.Fatalf("plans %+v", l)
	}
}

// BenchmarkPeerPlanCached is the per-bind cost of the plan: the pair compared with the one
// kept (64 buffers a side).
func BenchmarkPeerPlanCached(b *testing.B) {
	var p peerPlans
	log := zap.NewNop()
	local, peer := demoLayout(256), demoLayout(256)
	if err := p.plan(log, "a", local, peer); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		_ = p.plan(log, "a", local, peer)
	}
}

// BenchmarkPeerPlanFirst is the cost of planning a pair (once per peer and layout).
func BenchmarkPeerPlanFirst(b *testing.B) {
	local, peer := demoLayout(256), demoLayout(256)
	for b.Loop() {
		if _, err := transfer.PlanRanks(local, peer); err != nil {
			b.Fatal(err)
		}
	}
}
