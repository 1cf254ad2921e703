package room

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/rankmap"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// The data plane's own tests (moved with it from internal/service).

// wantField checks err is a FieldError naming field.
func wantField(t *testing.T, err error, field string) {
	t.Helper()
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != field {
		t.Fatalf("got %v, want a refusal of field %q", err, field)
	}
}

type region struct {
	path   string
	layout transfer.Layout
	mem    *transfer.Region
}

func newRegion(t testing.TB) region {
	t.Helper()
	l := transfer.UniformLayout(4, 64, 4096, 8, 64)
	path, err := transfer.CreateRegionFile(t.TempDir(), l)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := transfer.OpenRegion(path, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close(); os.Remove(path) })
	return region{path, l, mem}
}

func layoutPB(l transfer.Layout) *pb.RegionLayout {
	out := &pb.RegionLayout{Rank: &pb.Rank{TpRank: 0, TpSize: 1},
		Aux: &pb.AuxSpec{Offset: uint64(l.Aux.Offset), RowLen: uint32(l.Aux.RowLen), Rows: uint32(l.Aux.Rows)}}
	switch l.Attention {
	case rankmap.MHA:
		out.Attention = pb.Attention_ATTENTION_MHA
	case rankmap.MLA:
		out.Attention = pb.Attention_ATTENTION_MLA
	}
	for _, b := range l.Buffers {
		out.Buffers = append(out.Buffers, &pb.BufferSpec{Offset: uint64(b.Offset), Length: uint64(b.Length), ItemLen: uint32(b.ItemLen),
			PageTokens: uint32(b.PageTokens), TotalHeads: uint32(b.TotalHeads), RankHeads: uint32(b.RankHeads), HeadBytes: uint32(b.HeadBytes)})
	}
	return out
}

// tableNode is a decodeNode whose data-plane callbacks step a real poll
// table the way room.DecodeOwner does; the other calls are not used here.
type tableNode struct {
	decodeNode
	t   *poll.Table
	now int64
}

func (n *tableNode) step(ev poll.Event) {
	n.now += int64(time.Millisecond)
	_ = n.t.Step(n.now, ev)
}

func (n *tableNode) OnProgress(key poll.Key) { n.step(poll.Event{Kind: poll.EvFirstChunk, Key: key}) }

func (n *tableNode) OnRankDone(key poll.Key, rank int) {
	n.step(poll.Event{Kind: poll.EvFirstChunk, Key: key})
	n.step(poll.Event{Kind: poll.EvDone, Key: key, Rank: uint8(rank)})
}

func TestPageListValidation(t *testing.T) {
	const pages = 100
	cases := []struct {
		name  string
		pl    *pb.PageList
		field string
	}{
		{"nil", nil, "pages"},
		{"empty", &pb.PageList{}, "pages"},
		{"both", &pb.PageList{Indices: []int32{1}, Runs: []*pb.PageRun{{Start: 2, Count: 1}}}, "pages"},
		{"negative index", &pb.PageList{Indices: []int32{3, -1}}, "pages.indices[1]"},
		{"index past end", &pb.PageList{Indices: []int32{pages}}, "pages.indices[0]"},
		{"repeated index", &pb.PageList{Indices: []int32{4, 5, 4}}, "pages"},
		{"empty run", &pb.PageList{Runs: []*pb.PageRun{{Start: 1, Count: 0}}}, "pages.runs[0]"},
		{"run past end", &pb.PageList{Runs: []*pb.PageRun{{Start: 90, Count: 11}}}, "pages.runs[0]"},
		{"overlapping runs", &pb.PageList{Runs: []*pb.PageRun{{Start: 0, Count: 5}, {Start: 4, Count: 2}}}, "pages"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := pageRuns("pages", c.pl, pages)
			wantField(t, err, c.field)
		})
	}
}

func TestPageListKeepsOrderAndCoalesces(t *testing.T) {
	runs, err := pageRuns("pages", &pb.PageList{Indices: []int32{7, 8, 9, 2, 3}}, 10)
	if err != nil {
		t.Fatal(err)
	}
	want := []transfer.Run{{Start: 7, Count: 3}, {Start: 2, Count: 2}}
	if len(runs) != len(want) || runs[0] != want[0] || runs[1] != want[1] {
		t.Fatalf("runs %v, want %v", runs, want)
	}
	runs, err = pageRuns("pages", &pb.PageList{Runs: []*pb.PageRun{{Start: 0, Count: 2}, {Start: 2, Count: 3}}}, 10)
	if err != nil || len(runs) != 1 || runs[0] != (transfer.Run{Start: 0, Count: 5}) {
		t.Fatalf("runs %v %v, want one run of 5", runs, err)
	}
}

func TestLayoutValidation(t *testing.T) {
	_, err := layoutFromProto("layout", nil)
	wantField(t, err, "layout")
	_, err = layoutFromProto("layout", &pb.RegionLayout{Buffers: []*pb.BufferSpec{{Offset: 0, Length: 100, ItemLen: 0}}})
	wantField(t, err, "layout")
	l, err := layoutFromProto("layout", &pb.RegionLayout{
		Rank:    &pb.Rank{TpRank: 1, TpSize: 2},
		Buffers: []*pb.BufferSpec{{Offset: 0, Length: 4096, ItemLen: 1024}, {Offset: 4096, Length: 4096, ItemLen: 1024}},
		Aux:     &pb.AuxSpec{Offset: 8192, RowLen: 64, Rows: 4},
	})
	if err != nil {
		t.Fatal(err)
	}
	if l.Rank != (transfer.Rank{TP: 1, Size: 2}) || len(l.Buffers) != 2 || l.Buffers[1].Pages() != 4 {
		t.Fatalf("layout %+v", l)
	}
}

// A room's recorded SendMetadata lives until the room is forgotten (clear
// or reap), and a first call that failed is not kept: the scheduler may
// try again, and nothing is held for rooms that are gone.
func TestRecordedMetadataIsForgottenWithTheRoom(t *testing.T) {
	d := newDecodeData(transfer.KindTCP, transfer.ReceiverConfig{}, zaptest.NewLogger(t), nil)
	key := poll.Key{Room: 1, Nonce: 2}
	claim := func() bool {
		_, first := d.claimMetadata(key, &sentMetadata{done: make(chan struct{})})
		return first
	}
	md := &sentMetadata{done: make(chan struct{})}
	if _, first := d.claimMetadata(key, md); !first {
		t.Fatal("first call not taken as first")
	}
	d.settleMetadata(key, md, errors.New("refused"))
	if !claim() {
		t.Fatal("a failed first call is still recorded")
	}
	if claim() {
		t.Fatal("a second call is taken as first")
	}
	d.Forget(key)
	if n := len(d.metadata); n != 0 {
		t.Fatalf("%d rooms' metadata kept after Forget", n)
	}
}

// R11 at the data-plane key: a room fed by two ranks has two keys that
// differ only in rank. The data plane's Complete of one rank is that
// rank's completion, not the room's: the room is Success only once the
// other rank completes too, and a repeat of the first does not count.
func TestCompletionOfAnotherRankDoesNotCompleteTheRoom_R11(t *testing.T) {
	table, err := poll.New(poll.DefaultConfig(poll.Decode))
	if err != nil {
		t.Fatal(err)
	}
	node := &tableNode{t: table}
	d := newDecodeData(transfer.KindTCP, transfer.ReceiverConfig{}, zaptest.NewLogger(t), nil)
	d.node = node
	room := poll.Key{Room: 7, Nonce: 42}
	node.step(poll.Event{Kind: poll.EvOpen, Key: room, Peer: 1, Ranks: 2})
	node.step(poll.Event{Kind: poll.EvMetadata, Key: room, Peer: 1})
	rank0, rank1 := tkey(room, transfer.Rank{TP: 0, Size: 2}), tkey(room, transfer.Rank{TP: 1, Size: 2})
	if rank0 == rank1 {
		t.Fatalf("the two ranks of room %v share the data-plane key %v", room, rank0)
	}
	state := func() poll.State {
		in, err := table.Get(room.Room)
		if err != nil {
			t.Fatal(err)
		}
		return in.State
	}
	events := decodeEvents{d}
	events.Complete(rank1)
	if s := state(); s != poll.Transferring {
		t.Fatalf("after %v completed the room is %v, want Transferring (rank 0 has not)", rank1, s)
	}
	events.Complete(rank1)
	if s := state(); s != poll.Transferring {
		t.Fatalf("a repeated completion of %v moved the room to %v", rank1, s)
	}
	events.Complete(rank0)
	if s := state(); s != poll.Success {
		t.Fatalf("after both ranks completed the room is %v, want Success", s)
	}
}

// The decode adapter expects a room under the rank of its metadata and
// fences it under the rank of its region; they are one rank, so the fence
// ends that expectation and the room's key may be expected again.
func TestDecodeFenceEndsTheExpectationOfItsRank(t *testing.T) {
	reg := newRegion(t)
	d := newDecodeData(transfer.KindTCP, transfer.ReceiverConfig{}, zaptest.NewLogger(t), nil)
	d.node = &tableNode{}
	allowTempRegions(t, &d.slot)
	if _, err := d.slot.register(reg.path, layoutPB(reg.layout)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	key := poll.Key{Room: 7, Nonce: 42}
	md := Metadata{Key: key, Rank: Rank{TP: 0, Size: 1}, DstPages: &pb.PageList{Indices: []int32{1, 2}}, ExpectedRanks: 1}
	if err := d.Expect(md); err != nil {
		t.Fatal(err)
	}
	if err := d.Expect(md); err == nil {
		t.Fatal("a live expectation was taken twice")
	}
	if !d.Fence(key) {
		t.Fatal("fence of an idle room not done")
	}
	if err := d.Expect(md); err != nil {
		t.Fatalf("the fence did not end the expectation of rank %v: %v", md.Rank, err)
	}
}

// TestDataPlaneReadyLogNamesTheTransport: an operator can tell which data
// transport a daemon runs from its "data plane ready" line, logged on
// both sides once the region is registered and the data plane built.
func TestDataPlaneReadyLogNamesTheTransport(t *testing.T) {
	for _, side := range []string{"prefill", "decode"} {
		t.Run(side, func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			log := zap.New(core)
			r := newRegion(t)
			var slot *regionSlot
			var closeData func()
			switch side {
			case "prefill":
				d := newPrefillData(transfer.KindTCP, transfer.SenderConfig{}, log, nil)
				slot, closeData = &d.slot, d.Close
			case "decode":
				d := newDecodeData(transfer.KindTCP, transfer.ReceiverConfig{}, log, nil)
				slot, closeData = &d.slot, d.Close
			}
			defer closeData()
			allowTempRegions(t, slot)
			if _, err := slot.register(r.path, layoutPB(r.layout)); err != nil {
				t.Fatal(err)
			}
			ready := logs.FilterMessage("data plane ready").All()
			if len(ready) != 1 {
				t.Fatalf("%d \"data plane ready\" lines, want 1: %v", len(ready), logs.All())
			}
			fields := ready[0].ContextMap()
			if fields["transport"] != string(transfer.KindTCP) || fields["region"] != r.path {
				t.Fatalf("data plane ready fields %v, want transport %q and region %q", fields, transfer.KindTCP, r.path)
			}
		})
	}
}

// TestAnUnknownKindRefusesTheRegionNotTheProcess: a kind that reached the
// data plane without passing config validation fails RegisterRegion with
// the constructor's error rather than leaving a daemon without a data plane.
func TestAnUnknownKindRefusesTheRegionNotTheProcess(t *testing.T) {
	d := newDecodeData(transfer.Kind("carrier-pigeon"), transfer.ReceiverConfig{}, zap.NewNop(), nil)
	defer d.Close()
	r := newRegion(t)
	allowTempRegions(t, &d.slot)
	_, err := d.slot.register(r.path, layoutPB(r.layout))
	if err == nil || !strings.Contains(err.Error(), "carrier-pigeon") {
		t.Fatalf("register with an unknown kind: %v, want an error naming it", err)
	}
	if d.slot.get() != nil {
		t.Fatal("the region stayed registered without a data plane")
	}
}
