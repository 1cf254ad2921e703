package testbed

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pdlink/pdlink/internal/sim"
)

// Layout is a small model with many pages, so a few hundred small
// requests fit in flight at once: 4 buffers of 2048 pages of 4 KiB.
func Layout() sim.Layout {
	return sim.Layout{Layers: 2, PageTokens: 16, BytesPerToken: 1 << 10, Pages: 2048, AuxRows: 1024, AuxRowLen: 64}
}

// Workload is n requests of 1..8 pages, at most conc in flight, polled
// every 20 ms, every byte checked; a room not terminal within pinBound
// counts as pinned.
func Workload(n, conc int, pinBound time.Duration, seed uint64) sim.Config {
	return sim.Config{Requests: n, Concurrency: conc, MinTokens: 16, MaxTokens: 128, ChunkPages: 2,
		Tick: 20 * time.Millisecond, PinBound: pinBound, Seed: seed, CheckPages: true}
}

// Run runs workload w on s's engines, failing t if it cannot.
func Run(ctx context.Context, t testing.TB, s *sim.Sim, w sim.Config) *sim.Report {
	t.Helper()
	rep, err := s.Run(ctx, w)
	if err != nil {
		t.Fatalf("sim: %v", err)
	}
	return rep
}

// CheckReport fails t for what no scenario may end with: a room pinned or
// later than bound to terminal, a successful room with a wrong byte, a
// write after Failed (R7), pages written by another request, no room
// verified, or (allowed not nil) an outcome allowed does not accept.
func CheckReport(t testing.TB, rep *sim.Report, bound time.Duration, allowed func(outcome string) bool) {
	t.Helper()
	if rep.Pinned != 0 || rep.WorstTerminal > bound {
		t.Errorf("%d rooms pinned; worst time to terminal %v, bound %v", rep.Pinned, rep.WorstTerminal, bound)
	}
	if rep.Corrupt != 0 || rep.LateWrites != 0 || rep.Crossed != 0 {
		t.Errorf("%d successful rooms with a wrong byte, %d failed rooms written after Failed (R7), %d requests' pages written by another", rep.Corrupt, rep.LateWrites, rep.Crossed)
	}
	if rep.Verified == 0 {
		t.Errorf("no room succeeded and was verified")
	}
	if allowed != nil {
		for k, n := range rep.Outcomes {
			if !allowed(k) {
				t.Errorf("unexpected outcome %s x%d", k, n)
			}
		}
	}
}

// Summary is a report's line for the test log.
func Summary(rep *sim.Report, bound time.Duration) string {
	return fmt.Sprintf("%d rooms in %v; %s; worst time to terminal %v (bound %v); verified %d, corrupt %d, late writes %d, crossed %d",
		rep.Requests, rep.Elapsed.Round(time.Millisecond), Outcomes(rep), rep.WorstTerminal.Round(time.Millisecond), bound,
		rep.Verified, rep.Corrupt, rep.LateWrites, rep.Crossed)
}

// Outcomes is a report's outcome counts, sorted: "decode:success=12 ...".
func Outcomes(rep *sim.Report) string {
	keys := make([]string, 0, len(rep.Outcomes))
	for k := range rep.Outcomes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%d", k, rep.Outcomes[k])
	}
	return b.String()
}

// Merge adds b's counts to a (a scenario in several phases) and returns a.
func Merge(a, b *sim.Report) *sim.Report {
	a.Requests += b.Requests
	for k, v := range b.Outcomes {
		a.Outcomes[k] += v
	}
	for k, v := range b.Faults {
		a.Faults[k] += v
	}
	for k, v := range b.FaultOutcomes {
		a.FaultOutcomes[k] += v
	}
	for k, v := range b.CleanFailed {
		a.CleanFailed[k] += v
	}
	a.Verified += b.Verified
	a.Corrupt += b.Corrupt
	a.LateWrites += b.LateWrites
	a.Crossed += b.Crossed
	a.Pinned += b.Pinned
	a.Bytes += b.Bytes
	a.Elapsed += b.Elapsed
	a.LastChunkToSuccess = append(a.LastChunkToSuccess, b.LastChunkToSuccess...)
	a.WorstTerminal = max(a.WorstTerminal, b.WorstTerminal)
	return a
}

// KillOutcomes accepts the outcomes of a workload during which one daemon
// was killed -9 and restarted, survivor naming the other's side ("prefill"
// or "decode"). Any room may succeed, find its daemon unreachable or
// restarted (not_found), or be refused at open as unavailable. The
// survivor's rooms bound to the dead instance fail with peer_lost or
// peer_restarted; its prefill rooms never bound time out in
// Bootstrapping; a room the victim failed on its way down may be told
// (aborted:remote). transferError also accepts the survivor's rooms whose
// data connection the kill broke failing on it first (transfer_error).
func KillOutcomes(survivor string, transferError bool) func(outcome string) bool {
	return func(o string) bool {
		side, what, _ := strings.Cut(o, ":")
		switch {
		case what == "success", strings.HasPrefix(what, "unreachable:"), what == "not_found":
			return true
		case side == "open_error":
			return what == "unavailable"
		case side == survivor:
			return what == "peer_lost" || what == "peer_restarted" || what == "timeout:bootstrapping" || what == "aborted:remote" ||
				(transferError && what == "transfer_error")
		}
		return false
	}
}
