package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/sim"
)

// Both schedulers abort rooms at every moment of their life: before
// either side opened, right after one side opened (the abort reaches a
// room the other side has not opened yet, R4), after open, after metadata,
// in the middle of the chunks, and after Success. Every room ends within
// its bound, no byte lands in an aborted room's pages after its abort
// (R7), and the aborts never spill over: every request that was not
// aborted succeeds on both sides.
func TestAbortStormsFromBothSidesEndEveryRoomAndSpareTheOthers(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	n, conc := 200, 64
	if *long {
		n, conc = 2000, 200
	}
	w := c.workload(n, conc)
	w.Faults = sim.Faults{AbortPrefill: 0.25, AbortDecode: 0.25}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep := c.run(ctx, w)
	for k, n := range rep.CleanFailed {
		t.Errorf("a request nobody aborted failed: %s x%d", k, n)
	}
	for k, n := range rep.FaultOutcomes {
		fault, out, _ := strings.Cut(k, " -> ")
		// Known bug (TestDecodeAbortBeforeOpenIsToldToPrefill): a decode
		// room born Failed from the scheduler's early abort never tells
		// prefill, whose room waits out its bootstrap deadline.
		// Known bug (see knownInvalid): a decode abort mid-transfer may
		// reach prefill's data plane first and fail the room as invalid.
		if out == "prefill:invalid" && !strings.HasPrefix(fault, "abort_decode@") {
			t.Errorf("%s: %s x%d", fault, out, n)
		}
		if strings.Contains(out, "timeout:") && fault != "abort_decode@before_any_open" {
			t.Errorf("%s: %s x%d: an abort left the other side to its deadline (R8)", fault, out, n)
		}
		// An abort after the last chunk (mid_send on a one-chunk room) may
		// lose the race with Success, legitimately.
		if strings.HasPrefix(fault, "abort_") && strings.HasSuffix(out, ":success") && !strings.HasSuffix(fault, "@after_end") && !strings.HasSuffix(fault, "@mid_send") {
			t.Errorf("%s: %s x%d: an aborted room succeeded", fault, out, n)
		}
	}
	c.check("abort storm (both sides, every stage)", rep, func(o string) bool {
		_, what, _ := strings.Cut(o, ":")
		return what == "success" || strings.HasPrefix(what, "aborted:") || o == "prefill:timeout:bootstrapping" || knownInvalid(t, o)
	})
	t.Logf("outcomes by fault: %v", rep.FaultOutcomes)
}

// The decode scheduler aborts a request before it opened its receiver
// (the request was cancelled while queued). The abort leaves a tombstone,
// so OpenReceiver creates the room already Failed (I4): the prefill side
// of the same request must learn it (I9, R8) instead of waiting out its
// bootstrap deadline.
func TestDecodeAbortBeforeOpenIsToldToPrefill(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	w := c.workload(20, 10)
	w.Faults = sim.Faults{AbortDecode: 1, AbortStages: []sim.Stage{sim.StageBeforeAnyOpen}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rep := c.run(ctx, w)
	if n := rep.Outcomes["decode:aborted:local"]; n != w.Requests {
		t.Errorf("decode: %d of %d rooms born aborted:local: %v", n, w.Requests, rep.Outcomes)
	}
	if n := rep.Outcomes["prefill:aborted:remote"]; n != w.Requests {
		t.Errorf("prefill: %d of %d rooms learned decode's abort; outcomes %v", n, w.Requests, rep.Outcomes)
	}
	if rep.WorstTerminal >= c.tm.Bootstrap {
		t.Errorf("worst time to terminal %v: prefill waited for its bootstrap deadline (%v)", rep.WorstTerminal, c.tm.Bootstrap)
	}
	_ = pb.RoomState_ROOM_STATE_FAILED
}

// knownInvalid accepts prefill:invalid, with a log line: when decode fences
// an aborted room while prefill is still sending, the receiver answers the
// room's DONE with ReasonInvalid (pkg/transfer receiver_conn.go done(): an
// unknown or fenced room is "invalid"), which can beat decode's ABORT
// frame, so prefill fails the room as invalid instead of aborted:remote
// and the failure counts towards PdlinkFailuresRising. Harmless to the
// bytes, wrong in the metrics.
func knownInvalid(t *testing.T, o string) bool {
	if o == "prefill:invalid" {
		t.Logf("known bug: %s (decode's abort reached prefill through the data plane as invalid)", o)
		return true
	}
	return false
}
