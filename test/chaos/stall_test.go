package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pdlink/pdlink/internal/sim"
	"github.com/pdlink/pdlink/internal/testbed"
)

// stalled runs a workload where a share of the requests stall on one
// scheduler, samples both daemons' metrics meanwhile, and checks that
// every stalled room was visible while stuck: the overdue gauge of its
// state rose (it counts live rooms past half their deadline) and the
// oldest age of that state passed the overdue point, but no room outlived
// its deadline by more than the slack (the pin alert stays quiet).
func stalled(t *testing.T, name string, f sim.Faults, stuck map[string]string, deadline time.Duration, allowed func(string) bool) {
	c := newCluster(t, clusterOpts{})
	n, conc := 150, 100
	if *long {
		n, conc = 1500, 200
	}
	w := c.workload(n, conc)
	w.Faults = f
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	wt := c.watch(100 * time.Millisecond)
	rep := c.run(ctx, w)
	wt.Stop()
	for k, n := range rep.CleanFailed {
		t.Errorf("a request that did not stall failed: %s x%d", k, n)
	}
	for _, d := range c.daemons() {
		st, ok := stuck[d.Name]
		if !ok {
			continue
		}
		overdue := wt.Max(d, "pdlink_rooms_overdue", st)
		oldest := wt.Max(d, "pdlink_room_oldest_age_seconds", st)
		t.Logf("%s while stalled: up to %v rooms overdue in %s, oldest %.2fs (deadline %v)", d.Name, overdue, st, oldest, deadline)
		if overdue < 1 {
			t.Errorf("%s: pdlink_rooms_overdue{state=%q} never rose while rooms were stuck", d.Name, st)
		}
		if oldest < deadline.Seconds()/2 {
			t.Errorf("%s: pdlink_room_oldest_age_seconds{state=%q} peaked at %.2fs, stuck rooms reach %v", d.Name, st, oldest, deadline/2)
		}
		if oldest > (deadline + time.Second).Seconds() {
			t.Errorf("%s: a %s room was %.2fs old, past its %v deadline", d.Name, st, oldest, deadline)
		}
	}
	c.check(name, rep, allowed)
}

// The decode scheduler never sends metadata for a third of the rooms:
// both sides hold them in Bootstrapping, the metrics show them overdue,
// and the bootstrap deadline fails them on both sides (the first side to
// time out tells the other).
func TestStalledDecodeSchedulerRoomsShowInMetricsThenTimeOut(t *testing.T) {
	tm := testbed.ShortTimings()
	stalled(t, "stalled decode scheduler (no metadata)", sim.Faults{StallDecode: 0.33},
		map[string]string{"prefilld": "Bootstrapping", "decoded": "Bootstrapping"}, tm.Bootstrap,
		func(o string) bool {
			_, what, _ := strings.Cut(o, ":")
			return what == "success" || what == "timeout:bootstrapping" || what == "aborted:remote"
		})
}

// The prefill scheduler never sends the last chunk of a third of the
// rooms: both sides hold them in Transferring without progress (the
// earlier chunks' pages streamed to decode); the metrics show them, then
// prefill's idle deadline fails them and decode is told (or its own
// deadline fails them).
func TestStalledPrefillSchedulerRoomsShowInMetricsThenTimeOut(t *testing.T) {
	tm := testbed.ShortTimings()
	stalled(t, "stalled prefill scheduler (no last chunk)", sim.Faults{StallPrefill: 0.33},
		map[string]string{"prefilld": "Transferring", "decoded": "Transferring"}, tm.Idle,
		func(o string) bool {
			_, what, _ := strings.Cut(o, ":")
			return what == "success" || what == "timeout:transferring" || what == "timeout:waiting_for_input" || what == "aborted:remote"
		})
}

// Nobody calls Clear: terminal rooms stay visible (pdlink_rooms{Success}
// and {Failed}) until the clear linger, then both daemons reap them and
// count every one in pdlink_rooms_reaped_total{reason="uncleared"}.
func TestUnclearedRoomsAreReapedAfterLingerAndCounted(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	n, conc := 150, 100
	if *long {
		n, conc = 1500, 200
	}
	w := c.workload(n, conc)
	w.NoClear = true
	w.Faults = sim.Faults{AbortPrefill: 0.1, AbortDecode: 0.1, AbortStages: []sim.Stage{sim.StageAfterOpen, sim.StageAfterMetadata, sim.StageMidSend}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	opens := map[string]float64{}
	reaped := map[string]float64{}
	for _, d := range c.daemons() {
		opens[d.Name] = d.Metric("pdlink_room_transitions_total", map[string]string{"from": ""})
		reaped[d.Name] = d.Metric("pdlink_rooms_reaped_total", map[string]string{"reason": "uncleared"})
	}
	rep := c.run(ctx, w)
	ended := time.Now()
	for _, d := range c.daemons() {
		held := d.Metric("pdlink_rooms", map[string]string{"state": "Success"}) + d.Metric("pdlink_rooms", map[string]string{"state": "Failed"})
		if held == 0 {
			t.Errorf("%s: no terminal room held right after the run: the linger did not keep them", d.Name)
		}
	}
	leaks := testbed.TablesEmpty(c.daemons(), c.tm.Linger+5*time.Second, true)
	took := time.Since(ended)
	for _, d := range c.daemons() {
		o := d.Metric("pdlink_room_transitions_total", map[string]string{"from": ""}) - opens[d.Name]
		r := d.Metric("pdlink_rooms_reaped_total", map[string]string{"reason": "uncleared"}) - reaped[d.Name]
		t.Logf("%s: %v rooms opened, %v reaped as uncleared", d.Name, o, r)
		if o == 0 || r != o {
			t.Errorf("%s: %v rooms opened but %v reaped as uncleared", d.Name, o, r)
		}
	}
	if len(leaks) == 0 && took < c.tm.Linger-time.Second {
		t.Errorf("rooms gone %v after the run, before the %v linger", took, c.tm.Linger)
	}
	c.check("nobody calls Clear (reaped after linger)", rep, func(o string) bool {
		_, what, _ := strings.Cut(o, ":")
		return what == "success" || strings.HasPrefix(what, "aborted:") || knownInvalid(t, o)
	})
}
