package room

import (
	"errors"
	"testing"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/rankmap"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// describedProto is 2 buffers of 4 pages of 16 tokens x 8 heads x 128 bytes (16 KiB), TP 1.
func describedProto() *pb.RegionLayout {
	const item = 16 * 8 * 128
	b := func(off uint64) *pb.BufferSpec {
		return &pb.BufferSpec{Offset: off, Length: 4 * item, ItemLen: item, PageTokens: 16, TotalHeads: 8, RankHeads: 8, HeadBytes: 128}
	}
	return &pb.RegionLayout{Rank: &pb.Rank{TpSize: 1}, Attention: pb.Attention_ATTENTION_MHA,
		Buffers: []*pb.BufferSpec{b(0), b(4 * item)}, Aux: &pb.AuxSpec{Offset: 8 * item, RowLen: 64, Rows: 4}}
}

func TestLayoutFromProtoConvertsTheHeadShape(t *testing.T) {
	opaque := describedProto()
	opaque.Attention = pb.Attention_ATTENTION_UNSPECIFIED
	for _, b := range opaque.Buffers {
		b.PageTokens, b.TotalHeads, b.RankHeads, b.HeadBytes = 0, 0, 0, 0
	}
	l, err := layoutFromProto("layout", opaque)
	if err != nil || l.Described() || l.Buffers[1] != (transfer.BufferSpec{Offset: 4 * 16384, Length: 4 * 16384, ItemLen: 16384}) {
		t.Fatalf("opaque: %+v %v, want an opaque layout", l, err)
	}

	l, err = layoutFromProto("layout", describedProto())
	if err != nil {
		t.Fatal(err)
	}
	want := transfer.BufferSpec{Offset: 4 * 16384, Length: 4 * 16384, ItemLen: 16384, PageTokens: 16, TotalHeads: 8, RankHeads: 8, HeadBytes: 128}
	if !l.Described() || l.Attention != rankmap.MHA || l.Buffers[1] != want {
		t.Fatalf("described: %+v, want mha with buffer 1 %+v", l, want)
	}
	mla := describedProto()
	mla.Attention = pb.Attention_ATTENTION_MLA
	if l, err := layoutFromProto("layout", mla); err != nil || l.Attention != rankmap.MLA {
		t.Fatalf("mla: %+v %v", l, err)
	}
}

func TestLayoutFromProtoNamesTheInconsistentField(t *testing.T) {
	for _, c := range []struct {
		name  string
		edit  func(*pb.RegionLayout)
		field string
	}{
		{"unknown attention", func(l *pb.RegionLayout) { l.Attention = 9 }, "layout.attention"},
		{"head fields without attention", func(l *pb.RegionLayout) { l.Attention = pb.Attention_ATTENTION_UNSPECIFIED }, "layout.attention"},
		{"attention with an opaque buffer", func(l *pb.RegionLayout) { l.Buffers[1].HeadBytes = 0 }, "layout.buffers[1].head_bytes"},
		{"page tokens not the page", func(l *pb.RegionLayout) { l.Buffers[0].PageTokens = 32 }, "layout.buffers[0].item_len"},
		{"rank heads over tp", func(l *pb.RegionLayout) {
			l.Rank = &pb.Rank{TpSize: 2}
		}, "layout.buffers[0].rank_heads"},
		{"total heads not dividing tp", func(l *pb.RegionLayout) {
			l.Rank = &pb.Rank{TpSize: 3}
		}, "layout.buffers[0].total_heads"},
		{"mla with a slice of the latent", func(l *pb.RegionLayout) {
			l.Attention = pb.Attention_ATTENTION_MLA
			l.Buffers[1].TotalHeads = 16
		}, "layout.buffers[1].rank_heads"},
	} {
		l := describedProto()
		c.edit(l)
		_, err := layoutFromProto("layout", l)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != c.field {
			t.Errorf("%s: %v, want a refusal of field %q", c.name, err, c.field)
		}
	}
}
