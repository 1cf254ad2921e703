package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/sim"
	"github.com/pdlink/pdlink/internal/testbed"
)

// Two requests with the same room id at once (R5). The second opens while
// the first is live on both sides: its first open is refused with
// AlreadyExists, it touches nothing, the first succeeds with its own
// bytes, and neither request's bytes land in the other's pages.
func TestRoomIDReuseWhileLiveIsRefusedAndNeverCrosses(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	n, conc := 200, 50
	if *long {
		n, conc = 2000, 150
	}
	w := c.workload(n, conc)
	w.Reuse = sim.ReuseConcurrent
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep := c.run(ctx, w)
	pairs := n / 2
	if got := rep.Outcomes["open_error:alreadyexists"]; got != pairs {
		t.Errorf("%d of %d second requests were refused with AlreadyExists", got, pairs)
	}
	if rep.Outcomes["decode:success"] != pairs || rep.Outcomes["prefill:success"] != pairs {
		t.Errorf("not every first request succeeded: %v", rep.Outcomes)
	}
	for _, d := range c.daemons() {
		if v := d.Metric("pdlink_room_collisions_total", nil); v <= 0 {
			t.Logf("%s counted no collision (the refused open may have hit the other side)", d.Name)
		}
	}
	c.check("room id reused while live (second refused)", rep, func(o string) bool {
		return strings.HasSuffix(o, ":success") || o == "open_error:alreadyexists"
	})
}

// Pairs of requests with the same room id start at the same moment, each
// opening its two sides in its own random order, with and without the
// router relaying decode's nonce to prefill. Whatever interleaving wins,
// every room ends within its bound and no request ever ends Success with
// the other's bytes (pages carry a per-request pattern).
func TestRoomIDReuseRacingOpensNeverPinsOrCrosses(t *testing.T) {
	for _, relay := range []bool{false, true} {
		name := "no nonce relay"
		if relay {
			name = "nonce relayed"
		}
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			c := newCluster(t, clusterOpts{})
			n, conc := 200, 50
			if *long {
				n, conc = 2000, 150
			}
			w := c.workload(n, conc)
			w.Reuse, w.RelayNonce = sim.ReuseRace, relay
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			rep := c.run(ctx, w)
			c.check("room id reused by racing requests, "+name, rep, nil)
		})
	}
}

// A room id reused right after Clear, again and again, while some of the
// requests are aborted at random moments: late frames of the previous
// request (retransmitted ABORTs, STATUS, data chunks) never touch the
// next one. Every request that was not aborted succeeds.
func TestRoomIDReusedAfterClearIsNotTouchedByOldFrames(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	n, conc := 240, 40
	if *long {
		n, conc = 2400, 120
	}
	w := c.workload(n, conc)
	w.Reuse, w.ReuseChain = sim.ReuseAfterClear, 4
	w.Faults = sim.Faults{AbortPrefill: 0.2, AbortDecode: 0.2,
		AbortStages: []sim.Stage{sim.StageBeforePeerOpen, sim.StageAfterOpen, sim.StageAfterMetadata, sim.StageMidSend, sim.StageAfterSuccess}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep := c.run(ctx, w)
	for k, n := range rep.CleanFailed {
		t.Errorf("a request nobody aborted failed after its room id was reused: %s x%d", k, n)
	}
	c.check("room id reused after Clear (with aborts)", rep, func(o string) bool {
		_, what, _ := strings.Cut(o, ":")
		return what == "success" || strings.HasPrefix(what, "aborted:") || knownInvalid(t, o)
	})
}

// An ABORT from decode for a reused room id must not be swallowed by the
// ended tombstone of the previous request with that id. Prefill's room of
// the previous request ended unbound (nonce 0: aborted before decode's
// metadata) and was cleared; decode's new request opens the id and aborts
// before prefill opened it (R4). Prefill must keep the abort (I4) so its
// new room is born Failed, not wait out its bootstrap deadline.
func TestAbortForReusedRoomIDIsNotSwallowedByOldTombstone(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pre, dec := c.clients(t)
	const room = 7_000_001
	// The previous request: prefill opened, aborted before any metadata
	// (its room stays unbound, nonce 0), cleared.
	if _, err := pre.OpenSender(ctx, &pb.OpenSenderRequest{RoomId: room}); err != nil {
		t.Fatal(err)
	}
	if _, err := pre.Abort(ctx, &pb.PrefillServiceAbortRequest{RoomId: room}); err != nil {
		t.Fatal(err)
	}
	if _, err := pre.Clear(ctx, &pb.PrefillServiceClearRequest{RoomIds: []uint64{room}}); err != nil {
		t.Fatal(err)
	}
	// The next request with the same id: decode opens and aborts first.
	if _, err := dec.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: c.cfg.Bootstrap}); err != nil {
		t.Fatal(err)
	}
	// Prefill holds the previous request's ended tombstone; decode's ABORT
	// adds an abort tombstone beside it once prefill stepped it.
	held := c.pre.Metric("pdlink_tombstones", nil)
	if _, err := dec.Abort(ctx, &pb.DecodeServiceAbortRequest{RoomId: room}); err != nil {
		t.Fatal(err)
	}
	if _, ok := testbed.Eventually(c.tm.PeerBound(), func() bool { return c.pre.Metric("pdlink_tombstones", nil) > held }); !ok {
		t.Fatalf("prefill holds %v tombstones %v after decode's abort, as before it: the abort was swallowed", c.pre.Metric("pdlink_tombstones", nil), c.tm.PeerBound())
	}
	resp, err := pre.OpenSender(ctx, &pb.OpenSenderRequest{RoomId: room})
	if err != nil {
		t.Fatal(err)
	}
	if st := resp.GetStatus(); st.GetState() != pb.RoomState_ROOM_STATE_FAILED {
		t.Errorf("prefill's new room is %v, want born Failed by decode's abort (it will wait %v for its bootstrap deadline)", st.GetState(), c.tm.Bootstrap)
	}
}
