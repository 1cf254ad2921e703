package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/pdlink/pdlink/internal/testbed"
)

// killMidTransfer runs a workload with many rooms in flight, kills victim
// with SIGKILL once n/5 rooms ended, and restarts it on the same
// addresses a little later. It checks that the survivor failed every live
// room it held at the kill within the heartbeat bound, and that the
// restarted daemon serves new rooms to Success.
func killMidTransfer(t *testing.T, victimName string) {
	c := newCluster(t, clusterOpts{})
	victim, survivor := c.dec, c.pre
	if victimName == "prefilld" {
		victim, survivor = c.pre, c.dec
	}
	n, conc := 300, 100
	if *long {
		n, conc = 3000, 200
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The workload runs until the kill, so rooms are in flight at it.
	bg := testbed.StartBackground(ctx, t, c.sim, c.workload(0, conc), n/5)
	select {
	case <-bg.Warm:
	case <-time.After(2 * time.Minute):
		t.Fatal("rooms did not start ending")
	}
	// Kill mid-transfer: wait (bounded) until the victim holds enough live
	// rooms; on a loaded machine the workload can be between waves.
	// The reading that met the condition is the one reported: a second
	// scrape just before the kill would count rooms that ended since.
	var inflightAtKill float64
	if _, ok := testbed.Eventually(30*time.Second, func() bool {
		inflightAtKill = victim.Metric("pdlink_inflight_rooms", nil)
		return inflightAtKill >= 10
	}); !ok {
		t.Fatal("the victim never held 10 live rooms")
	}

	// The survivor's live rooms at the moment of the kill: every one of
	// them is bound to the victim (or waits for it) and must end.
	before, err := survivor.Rooms()
	if err != nil {
		t.Fatal(err)
	}
	var held []uint64
	bound := map[uint64]bool{}
	for _, r := range before {
		if testbed.Live(r.State) {
			held = append(held, r.Room)
			// Prefill rooms in Bootstrapping are not bound to a decode
			// peer yet: they end by their own deadline.
			bound[r.Room] = !(victim == c.dec && r.State == "Bootstrapping")
		}
	}
	lostBefore := survivor.Metric("pdlink_peer_departures_total", lostPeer)
	killed := time.Now()
	victim.Kill9()
	bg.Stop()

	// Watch the survivor until no room bound to the victim is live.
	tookBound, okBound := testbed.Eventually(c.tm.RoomBound(), func() bool {
		now, err := survivor.Rooms()
		if err != nil {
			return false
		}
		for _, r := range now {
			if testbed.Live(r.State) && bound[r.Room] {
				return false
			}
		}
		return true
	})
	// Keep it down until the survivor counted it lost.
	waitLost(t, survivor, lostBefore, c.tm)
	victim.RestartAndRegister(ctx, t, c.sim)
	restarted := time.Since(killed)
	rep := bg.Report()
	if rep == nil {
		t.FailNow()
	}
	// Let decode notice the new instance before the new rooms, so this
	// scenario measures a settled restart (rooms opened before it noticed
	// are TestRoomsOpenedJustAfterPrefillRestartAreToldOrServed's).
	if victim == c.pre && !c.dec.WaitLogged("peer restarted", c.tm.RoomBound()) {
		t.Errorf("decoded never noticed prefilld's restart")
	}
	// New rooms after the restart: every one succeeds on both sides.
	after := c.run(ctx, c.workload(n/3, conc))
	if after.Outcomes["decode:success"] != n/3 || after.Outcomes["prefill:success"] != n/3 {
		t.Errorf("after the restart of %s, not every new room succeeded: %v", victim.Name, after.Outcomes)
	}
	rep = testbed.Merge(rep, after)
	t.Logf("killed %s with %v rooms in flight on it (%d live on %s); restarted after %v; the survivor's rooms bound to it ended %v after the kill",
		victim.Name, inflightAtKill, len(held), survivor.Name, restarted.Round(time.Millisecond), tookBound.Round(time.Millisecond))
	if len(held) == 0 {
		t.Errorf("%s held no live room at the kill: the kill hit nothing", survivor.Name)
	}
	if !okBound || tookBound > c.tm.PeerBound() {
		t.Errorf("%s's rooms bound to the killed %s ended after %v (ok %v); heartbeat bound %v", survivor.Name, victim.Name, tookBound, okBound, c.tm.PeerBound())
	}
	if s := victim.Metric("pdlink_room_transitions_total", map[string]string{"to": "Success"}); s <= 0 {
		t.Errorf("the restarted %s served no room to Success", victim.Name)
	}
	sv := "prefill"
	if survivor == c.dec {
		sv = "decode"
	}
	if rep.Outcomes[sv+":peer_lost"]+rep.Outcomes[sv+":peer_restarted"] == 0 {
		t.Errorf("no %s room failed with peer_lost or peer_restarted: %v", sv, rep.Outcomes)
	}
	// The survivor's data connection to the dead peer may fail first
	// (transfer_error): pages stream from every Send, so decode reads
	// rooms mid-stream when prefilld dies, as prefill writes them when
	// decoded dies.
	c.check("kill -9 "+victim.Name+" mid-transfer, restart", rep, testbed.KillOutcomes(sv, true))
}

// kill -9 of decoded with a few hundred rooms in flight: prefill's rooms
// bound to the dead instance fail with peer_lost (or peer_restarted once
// the new instance registers) within the heartbeat bound, never pin, and
// decoded restarted on the same ports serves new rooms (the engine
// registers its region again).
func TestKillDecodedMidTransferFailsBoundRoomsWithinHeartbeatBound(t *testing.T) {
	killMidTransfer(t, "decoded")
}

// The same for prefilld restarted on the same bootstrap port: decode's
// rooms fail with peer_lost or peer_restarted within the heartbeat bound
// and decode's session reconnects and registers again.
func TestKillPrefilldMidTransferFailsBoundRoomsWithinHeartbeatBound(t *testing.T) {
	killMidTransfer(t, "prefilld")
}

// Rooms the decode scheduler opens right after prefilld restarted, before
// decoded noticed the new instance, are bound to the old one. The old
// instance never applied them, so decoded moves them to the new instance
// when it notices (poll.EvPeerReplaced) and they are served; a room the
// old instance did apply fails peer_restarted and the new instance is told,
// or the prefill room of the same request would wait out its bootstrap
// deadline. Either way: served, or failed on both sides at once (R8, R10).
func TestRoomsOpenedJustAfterPrefillRestartAreToldOrServed(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lostBefore := c.dec.Metric("pdlink_peer_departures_total", lostPeer)
	c.pre.Kill9()
	waitLost(t, c.dec, lostBefore, c.tm)
	c.pre.RestartAndRegister(ctx, t, c.sim)
	rep := c.run(ctx, c.workload(50, 50))
	t.Logf("outcomes %v, worst time to terminal %v", rep.Outcomes, rep.WorstTerminal)
	if n := rep.Outcomes["prefill:timeout:bootstrapping"]; n > 0 {
		t.Errorf("%d prefill rooms were left to their bootstrap deadline after decode failed them", n)
	}
	// Served, or failed on both sides within a second of each other: the
	// decode side as peer_restarted, the new prefill told at once.
	ok := rep.Outcomes["decode:success"] + rep.Outcomes["decode:peer_restarted"]
	told := rep.Outcomes["prefill:success"] + rep.Outcomes["prefill:aborted:remote"]
	if ok != 50 || told != 50 {
		t.Errorf("rooms opened after the restart neither served nor failed on both sides: %v", rep.Outcomes)
	}
	if rep.WorstTerminal > c.tm.PeerBound()+2*time.Second {
		t.Errorf("worst time to terminal %v: a side waited for a deadline", rep.WorstTerminal)
	}
}

var lostPeer = map[string]string{"reason": "lost"}

// waitLost waits until d counted one more peer lost than before (its
// heartbeats missed), failing after the heartbeat bound and some slack.
func waitLost(t *testing.T, d *testbed.Daemon, before float64, tm testbed.Timings) {
	t.Helper()
	if _, ok := testbed.Eventually(tm.PeerBound()+5*time.Second, func() bool {
		return d.Metric("pdlink_peer_departures_total", lostPeer) > before
	}); !ok {
		t.Fatalf("%s never counted its peer lost", d.Name)
	}
}
