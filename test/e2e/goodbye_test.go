package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pdlink/pdlink/internal/proc"
	"github.com/pdlink/pdlink/internal/sim"
	"github.com/pdlink/pdlink/internal/testbed"
)

// peerGauges reads a daemon's pdlink_peers{state="up"|"lost"}; waitPeers
// polls them until they are as wanted, failing after bound.
func peerGauges(t *testing.T, p *proc.Process, side string) (peers func() (float64, float64), waitPeers func(up, lost float64, bound time.Duration)) {
	up := `pdlink_peers{side="` + side + `",state="up"}`
	lost := `pdlink_peers{side="` + side + `",state="lost"}`
	peers = func() (float64, float64) { return metric(t, p.HTTPAddr, up), metric(t, p.HTTPAddr, lost) }
	waitPeers = func(wantUp, wantLost float64, bound time.Duration) {
		t.Helper()
		var u, l float64
		if _, ok := testbed.Eventually(bound, func() bool {
			u, l = peers()
			return u == wantUp && l == wantLost
		}); !ok {
			t.Fatalf("%s peers up %v lost %v after %v, want up %v lost %v\n%s", p.Name, u, l, bound, wantUp, wantLost, p.Logs())
		}
	}
	return peers, waitPeers
}

// holdNoPeers checks, for a while, that a daemon counts no peer up or lost.
func holdNoPeers(t *testing.T, p *proc.Process, peers func() (float64, float64), d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if u, l := peers(); u != 0 || l != 0 {
			t.Fatalf("%v before the end of the hold: %s peers up %v lost %v, want the peer gone\n%s", time.Until(end), p.Name, u, l, p.Logs())
		}
	}
	logs := p.Logs()
	// conn's "peer lost" (heartbeats), not zmtp's (a TCP connection closed).
	if !strings.Contains(logs, `"msg":"peer said goodbye"`) || strings.Contains(logs, `"msg":"peer lost","side"`) {
		t.Fatalf("%s did not log the goodbye, or logged a loss:\n%s", p.Name, logs)
	}
}

// A planned stop is not a lost peer. decoded stopped with SIGTERM (exit 0,
// nothing in flight) says goodbye: prefilld forgets it at once and never
// counts it in pdlink_peers{state="lost"}, however long it waits. decoded
// killed with -9 says nothing: prefilld counts it lost after the heartbeat
// misses, as before.
func TestSIGTERMDecodeIsForgottenKilledDecodeIsLost(t *testing.T) {
	const hbInterval, hbMisses = 200 * time.Millisecond, 3
	lostBound := hbInterval * hbMisses
	hb := []string{"--heartbeat-interval=" + hbInterval.String(), "--heartbeat-misses=3"}
	pre := startDaemon(t, "prefilld", append([]string{"--bootstrap-listen=tcp://127.0.0.1:0"}, hb...)...)
	bootstrap := pre.LogField("bootstrap socket bound", "addr")
	if bootstrap == "" {
		t.Fatalf("prefilld logged no bootstrap address:\n%s", pre.Logs())
	}
	peers, waitPeers := peerGauges(t, pre, "prefill")
	// decoded registers with prefilld when it opens its first room toward
	// it. It restarts on the same gRPC socket (the sim's engines register
	// their regions again) and a new data port: a new address.
	dec := startDaemon(t, "decoded", append([]string{"--data-listen=127.0.0.1:0"}, hb...)...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := sim.Config{
		PrefillGRPC: "unix://" + pre.GRPCAddr, DecodeGRPC: "unix://" + dec.GRPCAddr, Bootstrap: bootstrap,
		Dir: regionDir(t), Layout: sim.TestLayout(), Tick: time.Millisecond, Requests: 3, Concurrency: 1,
	}
	engines, err := sim.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer engines.Close()
	runRooms := func() {
		t.Helper()
		rep, err := engines.Run(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Outcomes["decode:success"] != cfg.Requests || rep.Corrupt != 0 || rep.Pinned != 0 {
			t.Fatalf("rooms: %v", rep.Outcomes)
		}
		waitPeers(1, 0, 5*time.Second)
	}

	runRooms()
	if err := dec.Stop(15 * time.Second); err != nil {
		t.Fatalf("decoded after SIGTERM: %v\n%s", err, dec.Logs())
	}
	waitPeers(0, 0, 2*time.Second)          // forgotten as soon as it left
	holdNoPeers(t, pre, peers, 3*lostBound) // forgotten, not lost, well past the heartbeat bound
	departures := func(reason string) float64 {
		return metric(t, pre.HTTPAddr, `pdlink_peer_departures_total{reason="`+reason+`",side="prefill"}`)
	}
	if g, l := departures("goodbye"), departures("lost"); g != 1 || l != 0 {
		t.Fatalf("after SIGTERM of decoded: departures goodbye %v lost %v, want 1 and 0", g, l)
	}

	dec, err = dec.Restart(ctx, nil, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dec.Kill() })
	if err := engines.Register(ctx); err != nil {
		t.Fatal(err)
	}
	runRooms() // the decode back is a new peer, not a restart
	if strings.Contains(pre.Logs(), `"msg":"peer restarted"`) {
		t.Errorf("the decode back after its goodbye was taken for a restart:\n%s", pre.Logs())
	}
	_ = dec.Kill()
	waitPeers(0, 1, lostBound+5*time.Second)
	if g, l := departures("goodbye"), departures("lost"); g != 1 || l != 1 {
		t.Fatalf("after kill -9 of decoded: departures goodbye %v lost %v, want 1 and 1", g, l)
	}
}

// The other direction: prefilld stopped with SIGTERM says goodbye too, and
// decoded drops its session to it instead of counting it lost.
func TestSIGTERMPrefillIsForgottenByDecode(t *testing.T) {
	const hbInterval = 200 * time.Millisecond
	pre, dec, cfg := pairProcs(t, "--heartbeat-interval="+hbInterval.String(), "--heartbeat-misses=3")
	peers, waitPeers := peerGauges(t, dec, "decode")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg.Requests, cfg.Concurrency = 3, 1
	rep, err := sim.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Outcomes["decode:success"] != cfg.Requests {
		t.Fatalf("rooms: %v", rep.Outcomes)
	}
	waitPeers(1, 0, 5*time.Second)
	if err := pre.Stop(15 * time.Second); err != nil {
		t.Fatalf("prefilld after SIGTERM: %v\n%s", err, pre.Logs())
	}
	waitPeers(0, 0, 2*time.Second)
	holdNoPeers(t, dec, peers, 3*3*hbInterval)
}
