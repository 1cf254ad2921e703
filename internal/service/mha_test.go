package service

import (
	"fmt"
	"testing"
	"time"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/daemon"
	"github.com/pdlink/pdlink/pkg/rankmap"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// mhaHeads is the model of the MHA tests: 8 KV heads of 64 bytes, 16-token
// pages; a rank of TP size n holds 8/n consecutive heads (at least 1).
const mhaHeads, mhaHeadBytes, mhaPageTokens = 8, 64, 16

func mhaLayout(rank transfer.Rank) transfer.Layout {
	rankHeads := max(mhaHeads/int(rank.Size), 1)
	l := transfer.UniformLayout(2, 64, int64(mhaPageTokens*rankHeads*mhaHeadBytes), 8, 64)
	l.Rank = rank
	return l.WithHeads(rankmap.MHA, mhaPageTokens, mhaHeads, mhaHeadBytes)
}

// mhaPair is a pair of pre prefill and dec decode ranks of mhaLayout; each
// room's source pages of prefill rank r are mhaSrc(r), its destination
// pages on decode rank r mhaDst(r), its aux rows r (prefill) and 7-r
// (decode).
type mhaPair struct {
	*tpPair
	pre, dec int
}

func mhaSrc(rank int) []int32 { return []int32{int32(3 + rank), 20, int32(30 + rank)} }
func mhaDst(rank int) []int32 { return []int32{int32(50 + rank), 9, int32(40 - rank)} }

func startMHAPair(t *testing.T, pre, dec int, tweak func(pre, dec *daemon.Config)) *mhaPair {
	t.Helper()
	return &mhaPair{tpPair: startMappedPairWith(t, pre, dec, mhaLayout, tweak), pre: pre, dec: dec}
}

// open opens room on every rank of both sides.
func (p *mhaPair) open(t *testing.T, room uint64) { p.openEveryRank(t, room) }

// meta is decode rank's SendMetadata for room.
func (p *mhaPair) meta(t *testing.T, room uint64, rank int) { p.metaRank(t, room, rank, mhaDst(rank)) }

// send is prefill rank's one last Send of room.
func (p *mhaPair) send(t *testing.T, room uint64, rank int) { p.sendRank(t, room, rank, mhaSrc(rank)) }

// checkBytes checks every byte of every decode rank's pages against the
// model: decode rank d's local head h is global head g = d*8/D+h, which
// prefill rank g/(8/P) holds at its local head g%(8/P) (computed here, not
// from rankmap); and each decode rank's aux row is the lowest prefill
// rank's that feeds it.
func (p *mhaPair) checkBytes(t *testing.T) {
	t.Helper()
	preHeads, decHeads := max(mhaHeads/p.pre, 1), max(mhaHeads/p.dec, 1)
	for d := range p.dec {
		for b := range p.tpPair.dec[d].layout.Buffers {
			for k, pg := range mhaDst(d) {
				got := p.tpPair.dec[d].mem.Pages(b, transfer.Run{Start: pg, Count: 1})
				for tok := range mhaPageTokens {
					for h := range decHeads {
						g := d*decHeads + h
						s, hs := g/preHeads, g%preHeads
						from := p.tpPair.pre[s].mem.Pages(b, transfer.Run{Start: mhaSrc(s)[k], Count: 1})
						want := from[(tok*preHeads+hs)*mhaHeadBytes:][:mhaHeadBytes]
						if at := (tok*decHeads + h) * mhaHeadBytes; string(got[at:at+mhaHeadBytes]) != string(want) {
							t.Fatalf("decode rank %d buffer %d page %d token %d head %d: not prefill rank %d's head %d", d, b, pg, tok, h, s, hs)
						}
					}
				}
			}
		}
		want := fmt.Sprintf("rank-%d-first-token", d*decHeads/preHeads)
		if got := string(p.tpPair.dec[d].mem.AuxRow(int64(7 - d))[:len(want)]); got != want {
			t.Fatalf("decode rank %d aux row %q, want %q", d, got, want)
		}
	}
}

// MHA with different TP (head slices): every byte of every decode rank's
// page is the right prefill rank's head, and the room is Success on both
// sides only once every (prefill, decode) pair delivered. On both data
// transports: over tcp prefill gathers the slices (2 -> 4, 1 -> 8) and
// decode scatters them (4 -> 2, 8 -> 1), and a wrong offset in either
// passes the checksum (the sender sums what it gathered, the receiver what
// it scattered): only these bytes show it.
func TestMHAWithDifferentTPMovesEveryHeadFromItsPrefillRank(t *testing.T) {
	for _, kind := range dataTransports {
		t.Run(string(kind), func(t *testing.T) { mhaWithDifferentTPMovesEveryHead(t, kind) })
	}
}

func mhaWithDifferentTPMovesEveryHead(t *testing.T, kind transfer.Kind) {
	for _, tc := range []struct{ pre, dec int }{{2, 4}, {4, 2}, {1, 8}, {8, 1}} {
		t.Run(fmt.Sprintf("%d->%d", tc.pre, tc.dec), func(t *testing.T) {
			p := startMHAPair(t, tc.pre, tc.dec, onTransport(kind))
			const room = 41
			for i := range tc.pre {
				p.fillRank(i, mhaSrc(i), int64(i))
			}
			p.open(t, room)
			for i := range tc.dec {
				p.meta(t, room, i)
			}
			p.waitPrefill(t, room, pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT)
			for i := range tc.pre {
				p.send(t, room, i)
			}
			waitBothSuccess(t, p.pair, room)
			p.checkBytes(t)
		})
	}
}

// MHA 4 -> 2, one prefill rank's engine restarts mid-room (a new
// generation of its region): the room bound on it (decode rank 0, fed by
// prefill ranks 0 and 1, sent its metadata) fails region_replaced on both
// sides; a room with no state on it yet (only decode rank 1, fed by
// prefill ranks 2 and 3, sent metadata) is untouched, and then succeeds
// over the new file with every byte right, on both data transports.
func TestMHAOnePrefillRanksNewGenerationFailsOnlyTheRoomsOnIt(t *testing.T) {
	for _, kind := range dataTransports {
		t.Run(string(kind), func(t *testing.T) { mhaNewGenerationFailsOnlyTheRoomsOnIt(t, kind) })
	}
}

func mhaNewGenerationFailsOnlyTheRoomsOnIt(t *testing.T, kind transfer.Kind) {
	p := startMHAPair(t, 4, 2, onTransport(kind))
	const held, spared = 51, 52
	p.open(t, held)
	p.open(t, spared)
	p.meta(t, held, 0)
	p.meta(t, held, 1)
	p.meta(t, spared, 1)
	p.waitPrefill(t, held, pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT)
	next := newRegionWithLayout(t, mhaLayout(transfer.Rank{TP: 1, Size: 4}))
	l := layoutPB(next.layout)
	l.Rank = tpRank(1, 4)
	res, err := p.prefill.RegisterRegion(ctxT(t), &pb.PrefillServiceRegisterRegionRequest{RegionPath: next.path, Layout: l})
	if err != nil {
		t.Fatal(err)
	}
	p.tpPair.pre[1] = next
	if res.RoomsFailed != 1 {
		t.Fatalf("prefill rank 1's new generation failed %d rooms, want 1 (held)", res.RoomsFailed)
	}
	eventually(t, "held Failed on both sides", func() bool {
		ps, ds := pollState(t, p.pair, held)
		return ps.State == pb.RoomState_ROOM_STATE_FAILED && ds.State == pb.RoomState_ROOM_STATE_FAILED
	})
	if ps, ds := pollState(t, p.pair, held); ps.Reason != "region_replaced" || ds.PeerReason != "region_replaced" {
		t.Fatalf("held: prefill reason %q, decode peer_reason %q; want region_replaced", ps.Reason, ds.PeerReason)
	}
	if ps, ds := pollState(t, p.pair, spared); ps.State == pb.RoomState_ROOM_STATE_FAILED || ds.State == pb.RoomState_ROOM_STATE_FAILED {
		t.Fatalf("spared touched by prefill rank 1's new generation: prefill %v %s, decode %v %s", ps.State, ps.Reason, ds.State, ds.Reason)
	}
	for i := range 4 {
		p.fillRank(i, mhaSrc(i), int64(i))
	}
	p.meta(t, spared, 0)
	p.waitPrefill(t, spared, pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT)
	for i := range 4 {
		p.send(t, spared, i)
	}
	waitBothSuccess(t, p.pair, spared)
	p.checkBytes(t)
}

// R11 with head slices: MHA 4 -> 2 where prefill rank 1 never sends (a
// slow or stuck rank). Decode rank 1 completes from ranks 2 and 3, decode
// rank 0 has only rank 0's half of every row: the room is never Success,
// and it fails on both sides within its deadline instead of pinning.
func TestMHASlowPrefillRankNeverPinsTheRoom_R11(t *testing.T) {
	const deadline = 1500 * time.Millisecond
	p := startMHAPair(t, 4, 2, func(pre, dec *daemon.Config) {
		for _, c := range []*daemon.Config{pre, dec} {
			c.WaitingTimeout, c.TransferIdleTimeout = deadline, deadline
		}
	})
	const room = 61
	for i := range 4 {
		p.fillRank(i, mhaSrc(i), int64(i))
	}
	p.open(t, room)
	p.meta(t, room, 0)
	p.meta(t, room, 1)
	p.waitPrefill(t, room, pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT)
	start := time.Now()
	for _, i := range []int{0, 2, 3} {
		p.send(t, room, i)
	}
	eventually(t, "the room Failed on both sides", func() bool {
		ps, ds := pollState(t, p.pair, room)
		if ps.State == pb.RoomState_ROOM_STATE_SUCCESS || ds.State == pb.RoomState_ROOM_STATE_SUCCESS {
			t.Fatalf("Success with prefill rank 1's heads missing: prefill %v, decode %v", ps.State, ds.State)
		}
		return ps.State == pb.RoomState_ROOM_STATE_FAILED && ds.State == pb.RoomState_ROOM_STATE_FAILED
	})
	if took := time.Since(start); took > 4*deadline {
		t.Fatalf("failed after %v, want within a few deadlines of %v", took, deadline)
	}
}
