package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pdlink/pdlink/internal/sim"
)

// Issue 15's TP ranks on real daemon processes: one simulated scheduler
// per rank on each side (internal/sim), each rank its own region file and
// pages, every byte of every decode rank checked against the prefill rank
// transfer.PlanRanks says feeds it.

// runRanks runs cfg's workload over a fresh pair at prefill TP p, decode
// TP d (MLA if mla) and returns what it saw.
func runRanks(t *testing.T, p, d int, mla bool, cfg func(*sim.Config)) *sim.Report {
	t.Helper()
	_, _, c := pairProcs(t)
	c.PrefillTP, c.DecodeTP, c.Layout.MLA = p, d, mla
	c.Requests, c.Concurrency, c.MinTokens, c.MaxTokens = 40, 4, 16, 512
	c.PinBound = 30 * time.Second
	if cfg != nil {
		cfg(&c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := sim.Run(ctx, c)
	if err != nil {
		t.Fatalf("sim at tp %d -> %d: %v", p, d, err)
	}
	return rep
}

// everyRoomVerified fails t unless every room succeeded on both sides with
// every decode rank's bytes checked, and every rank took its share.
func everyRoomVerified(t *testing.T, rep *sim.Report) {
	t.Helper()
	n := rep.Requests
	if rep.Outcomes["prefill:success"] != n || rep.Outcomes["decode:success"] != n || rep.Verified != n || rep.Corrupt != 0 || rep.Pinned != 0 {
		t.Fatalf("%d rooms: outcomes %v, %d verified, %d corrupt (by decode rank %v), %d pinned; first refusal %q",
			n, rep.Outcomes, rep.Verified, rep.Corrupt, rep.DecodeRanks, rep.Pinned, rep.FirstError)
	}
	var landed int64
	for _, r := range rep.DecodeRanks {
		if r.Rooms != n || r.Bytes == 0 {
			t.Errorf("decode rank %d: %d rooms, %d bytes; want all %d rooms", r.Rank, r.Rooms, r.Bytes, n)
		}
		landed += r.Bytes
	}
	if landed != rep.Bytes {
		t.Errorf("decode ranks landed %d bytes, the run counted %d", landed, rep.Bytes)
	}
}

// TestEqualTPMovesEveryRanksBytesThroughRealDaemons: prefill TP 2 -> decode
// TP 2 and 4 -> 4, 40 rooms each; every room Success on both sides, every
// decode rank holding exactly its prefill rank's pages and aux row, each
// prefill rank sending what its decode rank received (equal TP is the
// identity).
func TestEqualTPMovesEveryRanksBytesThroughRealDaemons(t *testing.T) {
	for _, tp := range []int{2, 4} {
		t.Run(fmt.Sprintf("tp%d", tp), func(t *testing.T) {
			rep := runRanks(t, tp, tp, false, nil)
			everyRoomVerified(t, rep)
			for i, r := range rep.PrefillRanks {
				if d := rep.DecodeRanks[i]; r.Bytes != d.Bytes || r.Rooms != d.Rooms {
					t.Errorf("prefill rank %d sent %d bytes in %d rooms, decode rank %d received %d in %d", i, r.Bytes, r.Rooms, i, d.Bytes, d.Rooms)
				}
			}
		})
	}
}

// TestMappingsOfDifferentTPMoveEveryByteThroughRealDaemons: MLA 2 -> 4 and
// 4 -> 2 (each decode rank fed whole pages by one prefill rank, the others
// dummies) and MHA 2 -> 4 and 4 -> 2 (head slices: each decode page split
// from, or merged out of, its prefill ranks' pages) have every byte of every
// decode rank verified against the source the mapping names. A mapping the
// layouts cannot carry is refused before any room (pkg/rankmap's property
// test, internal/service's layout tests).
func TestMappingsOfDifferentTPMoveEveryByteThroughRealDaemons(t *testing.T) {
	for _, c := range []struct {
		mla  bool
		p, d int
	}{{true, 2, 4}, {true, 4, 2}, {false, 2, 4}, {false, 4, 2}} {
		attention := map[bool]string{true: "mla", false: "mha"}[c.mla]
		t.Run(fmt.Sprintf("%s_%d_to_%d", attention, c.p, c.d), func(t *testing.T) {
			rep := runRanks(t, c.p, c.d, c.mla, func(cfg *sim.Config) { cfg.Requests = 12 })
			everyRoomVerified(t, rep)
		})
	}
}

// TestSlowPrefillRankNeverPinsARoomAtTP4 (R11 with TP 4 on both sides
// through the real processes): prefill rank 2's scheduler waits 300 ms
// before each of its Sends, past a control frame's first retransmit
// (100 ms) and its ack, while ranks 0, 1 and 3 send at once. Every room
// still reaches Success on both sides with every decode rank's bytes
// verified, none pinned, and no decode room is Success before the slow
// rank's last chunk: first Send -> Success is at least its 4 delays.
func TestSlowPrefillRankNeverPinsARoomAtTP4(t *testing.T) {
	const slowRank, delay, chunks = 2, 300 * time.Millisecond, 4
	rep := runRanks(t, 4, 4, false, func(cfg *sim.Config) {
		cfg.Requests, cfg.MinTokens, cfg.MaxTokens, cfg.ChunkPages = 12, 256, 256, 16/chunks // 16 pages in 4 chunks
		cfg.SendDelay = func(rank int) time.Duration {
			if rank == slowRank {
				return delay
			}
			return 0
		}
	})
	everyRoomVerified(t, rep)
	if fastest := rep.FirstSendPercentile(0); fastest < chunks*delay {
		t.Errorf("a room was Success %v after its first Send, before slow rank %d's %d delayed chunks (%v)", fastest, slowRank, chunks, chunks*delay)
	}
	if rep.WorstTerminal > 15*time.Second {
		t.Errorf("worst room took %v to end", rep.WorstTerminal)
	}
}

// TestReplicatedKVHeadsMoveEveryByteThroughRealDaemons: GQA models with
// fewer KV heads than one side's TP ranks, where consecutive ranks hold
// the same head (SGLang's tp_rank // (tp/heads)): decode ranks that share a
// head are each fed it by the one prefill rank holding it, and prefill
// replicas of a head feed a decode rank once. Every room Success on both
// sides, every byte of every decode rank verified against the source the
// mapping names (a head from the wrong rank or at the wrong row offset
// never matches).
func TestReplicatedKVHeadsMoveEveryByteThroughRealDaemons(t *testing.T) {
	for _, c := range []struct{ heads, p, d int }{
		{2, 2, 4}, {1, 1, 2}, {2, 1, 4}, {4, 2, 8},
		{2, 4, 2}, {1, 2, 1}, {2, 4, 1}, {4, 8, 2},
	} {
		t.Run(fmt.Sprintf("%dheads_%d_to_%d", c.heads, c.p, c.d), func(t *testing.T) {
			rep := runRanks(t, c.p, c.d, false, func(cfg *sim.Config) {
				cfg.Requests = 6
				// Two layers of K and V, heads of 256 bytes (128 bf16).
				cfg.Layout.BytesPerToken = int64(4 * c.heads * 256)
			})
			everyRoomVerified(t, rep)
		})
	}
}
