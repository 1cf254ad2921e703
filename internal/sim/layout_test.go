package sim

import (
	"testing"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/rankmap"
)

// TestLayoutDescribesItsHeadsToTheDaemons: the simulator's REGISTER layouts carry the head
// shape its knobs give (the demo layout is Llama-3-8B's 8 heads of 128 bf16 values), so the
// daemons plan described layouts end to end.
func TestLayoutDescribesItsHeadsToTheDaemons(t *testing.T) {
	tl, err := DemoLayout().Transfer()
	if err != nil {
		t.Fatal(err)
	}
	if tl.Attention != rankmap.MHA || tl.Buffers[0].TotalHeads != 8 || tl.Buffers[0].RankHeads != 8 || tl.Buffers[0].HeadBytes != 256 || tl.Buffers[0].PageTokens != 16 {
		t.Fatalf("demo layout %+v, want 16 tokens of 8 heads of 256 bytes", tl.Buffers[0])
	}
	l := layoutProto(tl)
	b := l.Buffers[63]
	if l.Attention != pb.Attention_ATTENTION_MHA || b.PageTokens != 16 || b.TotalHeads != 8 || b.RankHeads != 8 || b.HeadBytes != 256 {
		t.Fatalf("REGISTER layout attention %v buffer %+v, want mha 16 x 8 x 256", l.Attention, b)
	}
	opaque := TestLayout()
	opaque.HeadDim = 0
	if tl, err := opaque.Transfer(); err != nil || tl.Described() || layoutProto(tl).Buffers[0].HeadBytes != 0 {
		t.Fatalf("head-dim 0: %+v %v, want an opaque layout", tl, err)
	}
	misfit := TestLayout()
	misfit.BytesPerToken = 4*256 + 4 // not whole heads of 256 bytes
	if _, err := misfit.Transfer(); err == nil || misfit.HeadsFit() {
		t.Fatal("a row that is not whole heads was described")
	}
}
