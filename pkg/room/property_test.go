package room

import (
	"context"
	"flag"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

// roomPlan is what a random schedule does with one room.
type roomPlan struct {
	openAt        int // tick at which decode opens it
	prefillLag    int // ticks between decode's open and prefill's (negative: before)
	prefillOpens  bool
	ranks         int
	ranksArriving int // ranks the data plane delivers (< ranks: a lost rank)
	abortAt       int // tick of an abort, or -1
	abortOnDecode bool
}

// A random fault schedule (loss, duplication, reordering, a partition of
// random length, random aborts, lost ranks, prefill opening late or never)
// never pins a room: every room on both sides is terminal within its bound
// after it opened, and prefill reports Success only if decode did (I8).
func TestRandomFaultSchedulesNeverPinAndAgreeOnSuccess(t *testing.T) {
	if f := flag.Lookup("rapid.checks"); f != nil && f.Value.String() == f.DefValue {
		_ = f.Value.Set("25") // keep the default run fast; -rapid.checks=N for more
		defer func() { _ = f.Value.Set(f.DefValue) }()
	}
	rapid.Check(t, func(rt *rapid.T) {
		h := newHarness(t, rapid.Uint64().Draw(rt, "seed"))
		defer h.close()
		lf := conn.LinkFaults{
			Drop:      rapid.Float64Range(0, 0.3).Draw(rt, "drop"),
			Duplicate: rapid.Float64Range(0, 0.3).Draw(rt, "dup"),
			Reorder:   rapid.Float64Range(0, 0.5).Draw(rt, "reorder"),
			MaxHold:   time.Duration(rapid.IntRange(1, 10).Draw(rt, "hold")) * tTick,
		}
		h.net.SetFaults(decodeHost, prefillHost, lf)
		h.net.SetFaults(prefillHost, decodeHost, lf)
		partStart := rapid.IntRange(-1, 150).Draw(rt, "partition_at")
		partLen := rapid.IntRange(1, 60).Draw(rt, "partition_ticks")

		n := rapid.IntRange(1, 6).Draw(rt, "rooms")
		plans := make([]roomPlan, n)
		for i := range plans {
			p := &plans[i]
			p.openAt = rapid.IntRange(0, 100).Draw(rt, fmt.Sprintf("open%d", i))
			p.prefillLag = rapid.IntRange(-20, 40).Draw(rt, fmt.Sprintf("lag%d", i))
			p.prefillOpens = rapid.Float64().Draw(rt, fmt.Sprintf("popen%d", i)) < 0.9
			p.ranks = rapid.IntRange(1, 3).Draw(rt, fmt.Sprintf("ranks%d", i))
			p.ranksArriving = p.ranks
			if rapid.Float64().Draw(rt, fmt.Sprintf("lost%d", i)) < 0.15 {
				p.ranksArriving = rapid.IntRange(0, p.ranks-1).Draw(rt, fmt.Sprintf("arriving%d", i))
			}
			p.abortAt = -1
			if rapid.Float64().Draw(rt, fmt.Sprintf("abort%d", i)) < 0.2 {
				p.abortAt = p.openAt + rapid.IntRange(0, 150).Draw(rt, fmt.Sprintf("abortAt%d", i))
				p.abortOnDecode = rapid.Bool().Draw(rt, fmt.Sprintf("abortSide%d", i))
			}
		}

		keys := make([]poll.Key, n)
		opened := make([]int, n)     // tick decode opened the room, -1 before
		preOpened := make([]bool, n) // prefill opened it
		delivered := make([]bool, n)
		for i := range opened {
			opened[i] = -1
		}
		room := func(i int) poll.RoomID { return poll.RoomID(i + 1) }
		boundTicks := int(tBound/tTick) + 2
		lastOpen := 0
		for _, p := range plans {
			lastOpen = max(lastOpen, p.openAt, p.openAt+p.prefillLag)
		}
		end := lastOpen + boundTicks + 10
		for tick := 0; tick <= end; tick++ {
			switch tick {
			case partStart:
				h.net.Partition(prefillHost, decodeHost)
			case partStart + partLen:
				h.net.Heal(prefillHost, decodeHost)
			}
			for i, p := range plans {
				if p.prefillOpens && !preOpened[i] && tick == max(p.openAt+p.prefillLag, 0) {
					preOpened[i] = true
					if _, err := h.pre.Open(room(i), 0, 0); err != nil {
						rt.Fatalf("prefill open %d: %v", room(i), err)
					}
				}
				if tick == p.openAt {
					nonce, err := h.dec.Open(room(i), prefillAddr, p.ranks)
					if err != nil {
						rt.Fatalf("decode open: %v", err)
					}
					keys[i], opened[i] = poll.Key{Room: room(i), Nonce: nonce}, tick
					_ = h.dec.SendMetadata(room(i), MetadataRequest{Rank: Rank{Size: 1}, DstPages: pagesOf(i)})
				}
				if tick == p.abortAt {
					if p.abortOnDecode {
						_ = h.dec.Abort(context.Background(), room(i), "")
					} else {
						_ = h.pre.Abort(context.Background(), room(i), "")
					}
				}
				if opened[i] >= 0 && !delivered[i] && h.preDP.bound(keys[i]) {
					delivered[i] = true
					_ = h.pre.FirstSend(room(i))
					for rank := 0; rank < p.ranksArriving && !h.decDP.isFenced(keys[i]); rank++ {
						h.dec.OnProgress(keys[i])
						h.dec.OnRankDone(keys[i], rank)
					}
				}
				// The bound: terminal on both sides within tBound of opening.
				if opened[i] >= 0 && tick-opened[i] > boundTicks {
					ds := h.decState(room(i))
					if !ds.Terminal() {
						rt.Fatalf("room %d pinned on decode in %v after %d ticks (plan %+v)", room(i), ds, tick-opened[i], p)
					}
				}
				if preOpened[i] && tick-max(p.openAt+p.prefillLag, 0) > boundTicks {
					if ps := h.preState(room(i)); !ps.Terminal() {
						rt.Fatalf("room %d pinned on prefill in %v (plan %+v)", room(i), ps, p)
					}
				}
			}
			h.clk.Advance(tTick)
			h.settle()
		}
		for i := range plans {
			ps, ds := h.preState(room(i)), h.decState(room(i))
			if ps == poll.Success && ds != poll.Success {
				rt.Fatalf("room %d: prefill Success, decode %v (plan %+v)", room(i), ds, plans[i])
			}
			if ds == poll.Success && plans[i].ranksArriving < plans[i].ranks {
				rt.Fatalf("room %d: decode Success with a rank missing", room(i))
			}
		}
		h.checkInvariants()
	})
}
