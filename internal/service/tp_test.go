package service

import (
	"fmt"
	"sync"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/daemon"
	"github.com/pdlink/pdlink/pkg/rankmap"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// tpPair is a daemon pair serving n TP ranks each: rank i's region on
// both sides, registered with its rank.
type tpPair struct {
	*pair
	n        int // equal TP: both sides' tp_size
	pre, dec []region
}

func startTPPair(t *testing.T, n int) *tpPair {
	t.Helper()
	return startMappedPair(t, n, n, func(transfer.Rank) transfer.Layout { return newRegion(t).layout })
}

// startMappedPair is a pair of nPre prefill and nDec decode ranks, each
// rank's region of layout(rank).
func startMappedPair(t testing.TB, nPre, nDec int, layout func(transfer.Rank) transfer.Layout) *tpPair {
	t.Helper()
	return startMappedPairWith(t, nPre, nDec, layout, nil)
}

// startMappedPairWith is startMappedPair with the daemons' configs tweaked.
func startMappedPairWith(t testing.TB, nPre, nDec int, layout func(transfer.Rank) transfer.Layout, tweak func(pre, dec *daemon.Config)) *tpPair {
	t.Helper()
	return startMappedPairLoggingTo(t, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), nPre, nDec, layout, tweak)
}

// startMappedPairLoggingTo is startMappedPairWith with the daemons logging to log.
func startMappedPairLoggingTo(t testing.TB, log *zap.Logger, nPre, nDec int, layout func(transfer.Rank) transfer.Layout, tweak func(pre, dec *daemon.Config)) *tpPair {
	t.Helper()
	p := &tpPair{pair: startPairLoggingTo(t, log, tweak), n: nPre}
	for i := range max(nPre, nDec) {
		if i < nPre {
			pre := newRegionWithLayout(t, layout(transfer.Rank{TP: uint16(i), Size: uint16(nPre)}))
			lp := layoutPB(pre.layout)
			lp.Rank = tpRank(i, nPre)
			if _, err := p.prefill.RegisterRegion(ctxT(t), &pb.PrefillServiceRegisterRegionRequest{RegionPath: pre.path, Layout: lp}); err != nil {
				t.Fatalf("prefill rank %d: %v", i, err)
			}
			p.pre = append(p.pre, pre)
		}
		if i < nDec {
			dec := newRegionWithLayout(t, layout(transfer.Rank{TP: uint16(i), Size: uint16(nDec)}))
			ld := layoutPB(dec.layout)
			ld.Rank = tpRank(i, nDec)
			if _, err := p.decode.RegisterRegion(ctxT(t), &pb.DecodeServiceRegisterRegionRequest{RegionPath: dec.path, Layout: ld}); err != nil {
				t.Fatalf("decode rank %d: %v", i, err)
			}
			p.dec = append(p.dec, dec)
		}
	}
	return p
}

func tpRank(i, n int) *pb.Rank { return &pb.Rank{TpRank: uint32(i), TpSize: uint32(n)} }

// rankPages fills rank's source pages with bytes naming the rank, buffer,
// page and offset, and its aux row, so a page landing on the wrong rank
// (or from the wrong one) differs.
func (p *tpPair) fillRank(rank int, src []int32, auxRow int64) {
	pre := p.pre[rank]
	for b := range pre.layout.Buffers {
		for i, pg := range src {
			page := pre.mem.Pages(b, transfer.Run{Start: pg, Count: 1})
			for j := range page {
				page[j] = byte(rank*67 + b*31 + i*7 + j)
			}
		}
	}
	copy(pre.mem.AuxRow(auxRow), fmt.Sprintf("rank-%d-first-token", rank))
}

// openRoom opens room on every rank of both sides, as each rank's
// scheduler does, and answers decode's nonce (every rank's, the same).
func (p *tpPair) openRoom(t *testing.T, room uint64) uint64 {
	t.Helper()
	var nonce uint64
	for i := range p.n {
		if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room, Rank: tpRank(i, p.n)}); err != nil {
			t.Fatalf("OpenSender rank %d: %v", i, err)
		}
		ro, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap,
			ExpectedSenders: uint32(p.n), Rank: tpRank(i, p.n)})
		if err != nil {
			t.Fatalf("OpenReceiver rank %d: %v", i, err)
		}
		if i > 0 && ro.Status.Nonce != nonce {
			t.Fatalf("decode rank %d joined with nonce %d, rank 0 opened %d", i, ro.Status.Nonce, nonce)
		}
		nonce = ro.Status.Nonce
	}
	return nonce
}

// openEveryRank opens room on every rank of both sides, as each rank's
// scheduler does (expected_senders is the prefill TP size).
func (p *tpPair) openEveryRank(t *testing.T, room uint64) {
	t.Helper()
	for i := range p.pre {
		if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room, Rank: tpRank(i, len(p.pre))}); err != nil {
			t.Fatalf("OpenSender rank %d: %v", i, err)
		}
	}
	for i := range p.dec {
		if _, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap,
			ExpectedSenders: uint32(len(p.pre)), Rank: tpRank(i, len(p.dec))}); err != nil {
			t.Fatalf("OpenReceiver rank %d: %v", i, err)
		}
	}
}

// metaRank is decode rank's SendMetadata for room: pages dst, aux row 7-rank.
func (p *tpPair) metaRank(t *testing.T, room uint64, rank int, dst []int32) {
	t.Helper()
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, Rank: tpRank(rank, len(p.dec)),
		DstPages: &pb.PageList{Indices: dst}, AuxIndex: uint32(7 - rank)}); err != nil {
		t.Fatalf("SendMetadata room %d rank %d: %v", room, rank, err)
	}
}

// sendRank is prefill rank's one last Send of room: pages src, aux row rank.
func (p *tpPair) sendRank(t *testing.T, room uint64, rank int, src []int32) {
	t.Helper()
	if _, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Rank: tpRank(rank, len(p.pre)), Pages: &pb.PageList{Indices: src},
		Last: true, AuxIndex: uint32(rank)}); err != nil {
		t.Fatalf("Send room %d rank %d: %v", room, rank, err)
	}
}

// moveRoom is one room from open to both sides' Success, every rank taking
// part (dummies too): decode rank i's metadata names dst(i), prefill rank
// i sends src(i). A Failed side fails the test at once, with its reasons.
func (p *tpPair) moveRoom(t *testing.T, room uint64, src, dst func(rank int) []int32) {
	t.Helper()
	p.openEveryRank(t, room)
	for i := range p.dec {
		p.metaRank(t, room, i, dst(i))
	}
	p.waitPrefill(t, room, pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT)
	for i := range p.pre {
		p.sendRank(t, room, i, src(i))
	}
	waitBothSuccess(t, p.pair, room)
}

func (p *tpPair) waitPrefill(t *testing.T, room uint64, want pb.RoomState) {
	t.Helper()
	eventually(t, fmt.Sprintf("room %d %v on prefill", room, want), func() bool {
		ps, _ := pollState(t, p.pair, room)
		return ps.State == want
	})
}

// TP N -> N: rank i's pages and aux row reach decode rank i and no other,
// with every byte verified per rank, and the room is Success on both
// sides only once every rank delivered.
func TestEqualTPMovesEachRanksBytesToItsPeerRank(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(fmt.Sprintf("tp%d", n), func(t *testing.T) {
			p := startTPPair(t, n)
			const room = 77
			src := func(rank int) []int32 { return []int32{int32(3 + rank), 20, int32(30 + rank), 41} }
			dst := func(rank int) []int32 { return []int32{int32(50 + rank), 9, 10, int32(60 - rank)} }
			for i := range n {
				p.fillRank(i, src(i), int64(i))
			}
			p.openRoom(t, room)
			for i := range n {
				if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, Rank: tpRank(i, n),
					DstPages: &pb.PageList{Indices: dst(i)}, AuxIndex: uint32(7 - i)}); err != nil {
					t.Fatalf("SendMetadata rank %d: %v", i, err)
				}
			}
			eventually(t, "prefill WaitingForInput", func() bool {
				ps, _ := pollState(t, p.pair, room)
				return ps.State == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT
			})
			var wg sync.WaitGroup
			errs := make([]error, n)
			for i := range n {
				wg.Add(1)
				go func() { // each rank's scheduler sends on its own
					defer wg.Done()
					s := src(i)
					if _, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Rank: tpRank(i, n), Pages: &pb.PageList{Indices: s[:2]}}); err != nil {
						errs[i] = err
						return
					}
					_, errs[i] = p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: room, Rank: tpRank(i, n), StartPosition: 2,
						Pages: &pb.PageList{Indices: s[2:]}, Last: true, AuxIndex: uint32(i)})
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("Send rank %d: %v", i, err)
				}
			}
			waitBothSuccess(t, p.pair, room)
			for i := range n {
				pre, dec := p.pre[i], p.dec[i]
				for b := range dec.layout.Buffers {
					for k, pg := range dst(i) {
						want := pre.mem.Pages(b, transfer.Run{Start: src(i)[k], Count: 1})
						if got := dec.mem.Pages(b, transfer.Run{Start: pg, Count: 1}); string(got) != string(want) {
							t.Fatalf("decode rank %d buffer %d page %d differs from prefill rank %d page %d", i, b, pg, i, src(i)[k])
						}
					}
				}
				want := fmt.Sprintf("rank-%d-first-token", i)
				if got := string(dec.mem.AuxRow(int64(7 - i))[:len(want)]); got != want {
					t.Fatalf("decode rank %d aux row %q, want %q", i, got, want)
				}
			}
		})
	}
}

// A room is one per request per daemon: a second rank joins it, the same
// rank opening it again is AlreadyExists, a rank of another tp_size or a
// decode rank naming another prefill daemon is InvalidArgument naming the
// field (another expected_senders too). A rank's region must have
// its siblings' shape and tp_size (InvalidArgument naming layout and
// layout.rank).
func TestRanksJoinOneRoomAndConflictingOpensAreRefused(t *testing.T) {
	p := startTPPair(t, 2)
	const room = 5
	nonce := p.openRoom(t, room)
	if nonce == 0 {
		t.Fatal("nonce 0")
	}
	wantCode := func(what string, err error, code codes.Code, field string) {
		t.Helper()
		if status.Code(err) != code {
			t.Fatalf("%s: %v, want %v", what, err, code)
		}
		if field != "" {
			wantField(t, err, field)
		}
	}
	_, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room, Rank: tpRank(1, 2)})
	wantCode("prefill rank 1 again", err, codes.AlreadyExists, "")
	_, err = p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap, ExpectedSenders: 2, Rank: tpRank(0, 2)})
	wantCode("decode rank 0 again", err, codes.AlreadyExists, "")
	_, err = p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room, Rank: tpRank(1, 4)})
	wantCode("prefill rank of tp 4", err, codes.InvalidArgument, "rank")
	odd := newRegionWithLayout(t, transfer.UniformLayout(4, 64, 2048, 8, 64))
	l := layoutPB(odd.layout)
	l.Rank = tpRank(1, 2)
	_, err = p.decode.RegisterRegion(ctxT(t), &pb.DecodeServiceRegisterRegionRequest{RegionPath: odd.path, Layout: l})
	wantCode("decode rank 1 with another page size than rank 0", err, codes.InvalidArgument, "layout")
	l.Rank = tpRank(1, 4)
	_, err = p.prefill.RegisterRegion(ctxT(t), &pb.PrefillServiceRegisterRegionRequest{RegionPath: odd.path, Layout: l})
	wantCode("prefill rank of tp 4 beside ranks of tp 2", err, codes.InvalidArgument, "layout.rank")

	const other = 6
	if _, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: other, PrefillBootstrapAddr: p.bootstrap, ExpectedSenders: 2, Rank: tpRank(0, 2)}); err != nil {
		t.Fatal(err)
	}
	_, err = p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: other, PrefillBootstrapAddr: "tcp://127.0.0.1:1", ExpectedSenders: 2, Rank: tpRank(1, 2)})
	wantCode("decode rank 1 naming another prefill", err, codes.InvalidArgument, "prefill_bootstrap_addr")
	_, err = p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: other, PrefillBootstrapAddr: p.bootstrap, ExpectedSenders: 1, Rank: tpRank(1, 2)})
	wantCode("decode rank 1 expecting another number of prefill ranks", err, codes.InvalidArgument, "expected_senders")
}

// reregister gives rank its region again on one side, from a new file (a
// new generation), and answers how many rooms failed.
func (p *tpPair) reregister(t *testing.T, decode bool, rank int) (region, uint32) {
	t.Helper()
	r := newRegion(t)
	l := layoutPB(r.layout)
	l.Rank = tpRank(rank, p.n)
	if decode {
		res, err := p.decode.RegisterRegion(ctxT(t), &pb.DecodeServiceRegisterRegionRequest{RegionPath: r.path, Layout: l})
		if err != nil {
			t.Fatal(err)
		}
		p.dec[rank] = r
		return r, res.RoomsFailed
	}
	res, err := p.prefill.RegisterRegion(ctxT(t), &pb.PrefillServiceRegisterRegionRequest{RegionPath: r.path, Layout: l})
	if err != nil {
		t.Fatal(err)
	}
	p.pre[rank] = r
	return r, res.RoomsFailed
}

// One rank's engine restarts mid-room (a new generation of its region, or
// UnregisterRegion then a new file): a room spans every rank, so each room
// holding data-plane state on that rank (decode: its metadata; prefill:
// its binding) fails region_replaced on both sides; a room with no state
// on that rank yet is untouched and then succeeds on the new file, every
// byte verified.
func TestOneRanksNewGenerationFailsOnlyTheRoomsOnIt(t *testing.T) {
	for _, tc := range []struct{ side, how string }{{"decode", "register"}, {"prefill", "register"}, {"decode", "unregister"}, {"prefill", "unregister"}} {
		side := tc.side
		t.Run(side+"/"+tc.how, func(t *testing.T) {
			p := startTPPair(t, 2)
			const held, spared = 11, 12
			p.openRoom(t, held)
			p.openRoom(t, spared)
			src := func(rank int) []int32 { return []int32{int32(3 + rank), 20} }
			dst := func(rank int) []int32 { return []int32{int32(40 + rank), 50} }
			meta := func(room uint64, rank int) {
				t.Helper()
				if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, Rank: tpRank(rank, 2),
					DstPages: &pb.PageList{Indices: dst(rank)}, AuxIndex: uint32(rank)}); err != nil {
					t.Fatalf("SendMetadata room %d rank %d: %v", room, rank, err)
				}
			}
			// held has state on rank 1 on both sides (decode's metadata, and
			// prefill's binding once it is WaitingForInput); spared only on
			// rank 0.
			meta(held, 0)
			meta(held, 1)
			meta(spared, 0)
			eventually(t, "held WaitingForInput on prefill", func() bool {
				ps, _ := pollState(t, p.pair, held)
				return ps.State == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT
			})
			if tc.how == "unregister" {
				var failed uint32
				if side == "decode" {
					res, err := p.decode.UnregisterRegion(ctxT(t), &pb.DecodeServiceUnregisterRegionRequest{Rank: tpRank(1, 2)})
					if err != nil {
						t.Fatal(err)
					}
					failed = res.RoomsFailed
				} else {
					res, err := p.prefill.UnregisterRegion(ctxT(t), &pb.PrefillServiceUnregisterRegionRequest{Rank: tpRank(1, 2)})
					if err != nil {
						t.Fatal(err)
					}
					failed = res.RoomsFailed
				}
				if failed != 1 {
					t.Fatalf("unregistering %s rank 1 failed %d rooms, want 1 (the one with state on it)", side, failed)
				}
			}
			_, failed := p.reregister(t, side == "decode", 1)
			if want := map[string]uint32{"register": 1, "unregister": 0}[tc.how]; failed != want {
				t.Fatalf("registering %s rank 1 (after %s) failed %d rooms, want %d", side, tc.how, failed, want)
			}
			eventually(t, "held Failed on both sides", func() bool {
				ps, ds := pollState(t, p.pair, held)
				return ps.State == pb.RoomState_ROOM_STATE_FAILED && ds.State == pb.RoomState_ROOM_STATE_FAILED
			})
			ps, ds := pollState(t, p.pair, held)
			if local, peer := map[string]*pb.RoomStatus{"prefill": ps, "decode": ds}[side], map[string]*pb.RoomStatus{"prefill": ds, "decode": ps}[side]; local.Reason != "region_replaced" || peer.PeerReason != "region_replaced" {
				t.Fatalf("held: %s reason %q, peer's peer_reason %q; want region_replaced", side, local.Reason, peer.PeerReason)
			}
			if ps, ds := pollState(t, p.pair, spared); ps.State != pb.RoomState_ROOM_STATE_BOOTSTRAPPING || ds.State == pb.RoomState_ROOM_STATE_FAILED {
				t.Fatalf("spared touched by rank 1's new generation: prefill %v, decode %v %s", ps.State, ds.State, ds.Reason)
			}
			// spared goes on with rank 1 on the new file.
			for i := range 2 {
				p.fillRank(i, src(i), int64(i))
			}
			meta(spared, 1)
			eventually(t, "spared WaitingForInput on prefill", func() bool {
				ps, _ := pollState(t, p.pair, spared)
				return ps.State == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT
			})
			for i := range 2 {
				if _, err := p.prefill.Send(ctxT(t), &pb.SendRequest{RoomId: spared, Rank: tpRank(i, 2), Pages: &pb.PageList{Indices: src(i)},
					Last: true, AuxIndex: uint32(i)}); err != nil {
					t.Fatalf("Send rank %d: %v", i, err)
				}
			}
			waitBothSuccess(t, p.pair, spared)
			for i := range 2 {
				for b := range p.dec[i].layout.Buffers {
					for k, pg := range dst(i) {
						want := p.pre[i].mem.Pages(b, transfer.Run{Start: src(i)[k], Count: 1})
						if got := p.dec[i].mem.Pages(b, transfer.Run{Start: pg, Count: 1}); string(got) != string(want) {
							t.Fatalf("spared: decode rank %d buffer %d page %d differs from prefill rank %d page %d", i, b, pg, i, src(i)[k])
						}
					}
				}
			}
		})
	}
}

// A decode rank whose METADATA maps to a prefill rank with no region here
// (its engine never registered, or unregistered) fails the room invalid on
// both sides at once: no stream is opened for a rank that has no file.
func TestMetadataForAPrefillRankWithNoRegionFailsTheRoom(t *testing.T) {
	p := startPair(t)
	for i := range 2 {
		r := newRegion(t)
		l := layoutPB(r.layout)
		l.Rank = tpRank(i, 2)
		if _, err := p.decode.RegisterRegion(ctxT(t), &pb.DecodeServiceRegisterRegionRequest{RegionPath: r.path, Layout: l}); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			continue // prefill rank 1 has no region
		}
		if _, err := p.prefill.RegisterRegion(ctxT(t), &pb.PrefillServiceRegisterRegionRequest{RegionPath: r.path, Layout: l}); err != nil {
			t.Fatal(err)
		}
	}
	const room = 9
	if _, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room, Rank: tpRank(0, 2)}); err != nil {
		t.Fatal(err)
	}
	_, err := p.prefill.OpenSender(ctxT(t), &pb.OpenSenderRequest{RoomId: room, Rank: tpRank(1, 2)})
	wantField(t, err, "rank")
	for i := range 2 {
		if _, err := p.decode.OpenReceiver(ctxT(t), &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap, ExpectedSenders: 2, Rank: tpRank(i, 2)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.decode.SendMetadata(ctxT(t), &pb.SendMetadataRequest{RoomId: room, Rank: tpRank(1, 2), DstPages: &pb.PageList{Indices: []int32{1}}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the room Failed invalid on both sides", func() bool {
		ps, ds := pollState(t, p, room)
		return ps.State == pb.RoomState_ROOM_STATE_FAILED && ps.Reason == "invalid" &&
			ds.State == pb.RoomState_ROOM_STATE_FAILED && ds.PeerReason == "invalid"
	})
}

// mlaLayout is the test region's shape as MLA: one latent head per token,
// replicated on every rank.
func mlaLayout(rank transfer.Rank) transfer.Layout {
	l := transfer.UniformLayout(4, 64, 4096, 8, 64)
	l.Rank = rank
	return l.WithHeads(rankmap.MLA, 16, 1, 256)
}

// MLA with different TP (SGLang's replicated latent): each decode rank is
// fed whole pages by exactly one prefill rank (Mapping.DecodeRanks[d].From),
// the other prefill ranks it addresses are dummies whose Sends move
// nothing, and a prefill rank may feed several decode ranks. Every decode
// rank's pages and aux row are its source rank's, byte for byte, and the
// room is Success on both sides once each decode rank completed.
func TestMLAWithDifferentTPFeedsEachDecodeRankFromOnePrefillRank(t *testing.T) {
	for _, tc := range []struct{ pre, dec int }{{2, 4}, {4, 2}, {4, 1}} {
		t.Run(fmt.Sprintf("%d->%d", tc.pre, tc.dec), func(t *testing.T) {
			p := startMappedPair(t, tc.pre, tc.dec, mlaLayout)
			m, err := transfer.PlanRanks(mlaLayout(transfer.Rank{Size: uint16(tc.pre)}), mlaLayout(transfer.Rank{Size: uint16(tc.dec)}))
			if err != nil {
				t.Fatal(err)
			}
			const room = 21
			src := func(rank int) []int32 { return []int32{int32(3 + rank), 20, int32(30 + rank)} }
			dst := func(rank int) []int32 { return []int32{int32(50 + rank), 9, int32(60 - rank)} }
			for i := range tc.pre {
				p.fillRank(i, src(i), int64(i))
			}
			p.moveRoom(t, room, src, dst)
			for d := range tc.dec {
				from := m.DecodeRanks[d].From
				if len(from) != 1 {
					t.Fatalf("decode rank %d fed by %v, want one prefill rank", d, from)
				}
				s := from[0]
				for b := range p.dec[d].layout.Buffers {
					for k, pg := range dst(d) {
						want := p.pre[s].mem.Pages(b, transfer.Run{Start: src(s)[k], Count: 1})
						if got := p.dec[d].mem.Pages(b, transfer.Run{Start: pg, Count: 1}); string(got) != string(want) {
							t.Fatalf("decode rank %d buffer %d page %d differs from prefill rank %d page %d", d, b, pg, s, src(s)[k])
						}
					}
				}
				want := fmt.Sprintf("rank-%d-first-token", s)
				if got := string(p.dec[d].mem.AuxRow(int64(7 - d))[:len(want)]); got != want {
					t.Fatalf("decode rank %d aux row %q, want %q", d, got, want)
				}
			}
		})
	}
}
