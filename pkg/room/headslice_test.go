package room

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"testing"

	"go.uber.org/zap/zaptest"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/rankmap"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// The data plane's head-slice refusals keep their chain under this
// package's sentinels, which the service edge maps; other refusals are not
// taken for them.
func TestHeadSliceErrorsKeepTheirKind(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error
	}{
		{fmt.Errorf("open: %w", transfer.ErrBadSlice), ErrBadHeadSlice},
		{fmt.Errorf("expect: %w", transfer.ErrSliceMismatch), ErrHeadSliceMismatch},
		{transfer.ErrRunsMismatch, nil},
	} {
		got := headSliceError(tc.err)
		if tc.want == nil {
			if got != nil {
				t.Errorf("%v: %v, want nil", tc.err, got)
			}
			continue
		}
		if !errors.Is(got, tc.want) || !errors.Is(got, tc.err) {
			t.Errorf("%v: %v, want %v wrapping it", tc.err, got, tc.want)
		}
	}
}

// mhaRegion is a decode rank's region of an MHA model of 8 heads of 64
// bytes in 16-token pages, at TP size of rank.
func mhaRegion(t *testing.T, rank transfer.Rank) (region, *pb.RegionLayout) {
	t.Helper()
	l := transfer.UniformLayout(2, 64, int64(16*(8/int(rank.Size))*64), 8, 64)
	l.Rank = rank
	l = l.WithHeads(rankmap.MHA, 16, 8, 64)
	path, err := transfer.CreateRegionFile(t.TempDir(), l)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := transfer.OpenRegion(path, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mem.Close(); os.Remove(path) })
	lp := layoutPB(l)
	lp.Rank = &pb.Rank{TpRank: uint32(rank.TP), TpSize: uint32(rank.Size)}
	return region{path, l, mem}, lp
}

// A decode rank fed head slices by several prefill ranks expects one
// stream per prefill rank (keys that differ by From); its fence ends every
// one of them, so the room's key may be expected again, and a rank is done
// only once each of its prefill ranks completed (R11 per pair).
func TestSlicedExpectationsAreFencedAndCompletedPerPrefillRank_R11(t *testing.T) {
	table, err := poll.New(poll.DefaultConfig(poll.Decode))
	if err != nil {
		t.Fatal(err)
	}
	node := &tableNode{t: table}
	d := newDecodeData(transfer.KindTCP, transfer.ReceiverConfig{}, zaptest.NewLogger(t), nil)
	d.node = node
	allowTempRegions(t, &d.slot)
	for tp := range 2 {
		reg, lp := mhaRegion(t, transfer.Rank{TP: uint16(tp), Size: 2})
		if _, err := d.slot.register(reg.path, lp); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(d.Close)
	key := poll.Key{Room: 7, Nonce: 42}
	md := func(tp uint16) Metadata {
		return Metadata{Key: key, Rank: Rank{TP: tp, Size: 2}, DstPages: &pb.PageList{Indices: []int32{1, 2}}, ExpectedRanks: 2, PrefillTP: 4}
	}
	for tp := range uint16(2) {
		if err := d.Expect(md(tp)); err != nil {
			t.Fatal(err)
		}
		if err := d.Expect(md(tp)); err == nil {
			t.Fatalf("rank %d's live expectations were taken twice", tp)
		}
	}
	if !d.Fence(key) {
		t.Fatal("fence of an idle room not done")
	}
	for tp := range uint16(2) {
		if err := d.Expect(md(tp)); err != nil {
			t.Fatalf("the fence did not end rank %d's head-slice expectations: %v", tp, err)
		}
	}
	node.step(poll.Event{Kind: poll.EvOpen, Key: key, Peer: 1, Ranks: 2})
	node.step(poll.Event{Kind: poll.EvMetadata, Key: key, Peer: 1})
	state := func() poll.State {
		in, err := table.Get(key.Room)
		if err != nil {
			t.Fatal(err)
		}
		return in.State
	}
	pair := func(dec, pre uint16) transfer.Key {
		k := tkey(key, transfer.Rank{TP: dec, Size: 2})
		k.From = transfer.Rank{TP: pre, Size: 4}
		return k
	}
	events := decodeEvents{d}
	for _, k := range []transfer.Key{pair(0, 0), pair(1, 2), pair(1, 3)} {
		events.Complete(k)
		if s := state(); s == poll.Success {
			t.Fatalf("Success after %v, with decode rank 0's heads from prefill rank 1 missing", k)
		}
	}
	events.Complete(pair(0, 1))
	if s := state(); s != poll.Success {
		t.Fatalf("after every pair completed the room is %v, want Success", s)
	}
}

// A prefill room's fence covers the streams its shares opened, which are
// keyed by the decode rank they feed (MLA and MHA between TP sizes: not a
// local rank's key) and, for head slices, by the prefill rank too.
func TestPrefillFenceCoversTheStreamKeysOfEveryShare(t *testing.T) {
	d := newPrefillData(transfer.KindTCP, transfer.SenderConfig{}, zaptest.NewLogger(t), nil)
	key := poll.Key{Room: 9, Nonce: 3}
	whole := &prefillRoom{key: key, rank: transfer.Rank{TP: 0, Size: 1}, dstRank: transfer.Rank{TP: 2, Size: 4}}
	sliced := &prefillRoom{key: key, rank: transfer.Rank{TP: 0, Size: 1}, dstRank: transfer.Rank{TP: 3, Size: 4},
		copies: []rankmap.Copy{{Heads: 1, HeadBytes: 64, PageTokens: 16, SrcRow: 128, DstRow: 64}}}
	d.rooms[roomRank{key.Room, 0}] = []*prefillRoom{whole, sliced}
	keys := d.streamKeys(key)
	withFrom := tkey(key, sliced.dstRank)
	withFrom.From = sliced.rank
	for _, want := range []transfer.Key{tkey(key, whole.dstRank), withFrom} {
		if !slices.Contains(keys, want) {
			t.Errorf("the room's fence keys %v miss the stream %v", keys, want)
		}
	}
}

// Decode plans a rank's streams from its own layout and the prefill TP
// (slicedSources); prefill from both real layouts (wholePages,
// Mapping.CopiesFrom). For every pair of TP sizes and head counts rankmap
// accepts, replicated heads among them, both must name the same streams:
// whole pages keyed by the decode rank alone, or one head-slice stream per
// prefill rank of the rank's From with that pair's copies. A disagreement
// is a room whose every chunk decode discards (2 heads at TP 2 -> 4 was).
func TestBothSidesPlanTheSameStreamsForEveryMapping(t *testing.T) {
	const pageTokens, headBytes = 4, 16
	layout := func(heads, tp, rank int) transfer.Layout {
		l := transfer.UniformLayout(2, 8, int64(pageTokens*max(heads/tp, 1)*headBytes), 2, 8)
		l.Rank = transfer.Rank{TP: uint16(rank), Size: uint16(tp)}
		return l.WithHeads(rankmap.MHA, pageTokens, int64(heads), headBytes)
	}
	for _, heads := range []int{1, 2, 4, 8, 16} {
		for _, p := range []int{1, 2, 4, 8} {
			for _, dtp := range []int{1, 2, 4, 8} {
				m, err := transfer.PlanRanks(layout(heads, p, 0), layout(heads, dtp, 0))
				if err != nil {
					continue // a pair rankmap refuses never carries a room
				}
				for d := range dtp {
					rank := transfer.Rank{TP: uint16(d), Size: uint16(dtp)}
					sources, err := slicedSources(layout(heads, dtp, d), p, rank)
					if err != nil {
						t.Fatalf("%d heads %d -> %d decode rank %d: %v", heads, p, dtp, d, err)
					}
					if whole := wholePages(m, d); whole != (sources == nil) {
						t.Fatalf("%d heads %d -> %d decode rank %d: prefill sends whole pages %v, decode expects %d head-slice streams",
							heads, p, dtp, d, whole, len(sources))
					}
					var from []int
					for _, s := range sources {
						from = append(from, int(s.rank.TP))
						if want := m.CopiesFrom(int(s.rank.TP), d); !slices.Equal(s.copies, want) {
							t.Fatalf("%d heads %d -> %d: decode rank %d expects %v from prefill rank %d, which sends %v",
								heads, p, dtp, d, s.copies, s.rank.TP, want)
						}
					}
					if sources != nil && !slices.Equal(from, m.DecodeRanks[d].From) {
						t.Fatalf("%d heads %d -> %d: decode rank %d expects streams from %v, the mapping feeds it from %v",
							heads, p, dtp, d, from, m.DecodeRanks[d].From)
					}
				}
			}
		}
	}
}
