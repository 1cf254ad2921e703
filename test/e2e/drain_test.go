package e2e

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/proc"
	"github.com/pdlink/pdlink/internal/sim"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// pairProcs starts prefilld and decoded as child processes and returns a
// sim config pointing at them.
func pairProcs(t *testing.T, extra ...string) (pre, dec *proc.Process, cfg sim.Config) {
	t.Helper()
	pre = startDaemon(t, "prefilld", append([]string{"--bootstrap-listen=tcp://127.0.0.1:0"}, extra...)...)
	dec = startDaemon(t, "decoded", append([]string{"--data-listen=127.0.0.1:0"}, extra...)...)
	cfg = sim.Config{
		PrefillGRPC: "unix://" + pre.GRPCAddr, DecodeGRPC: "unix://" + dec.GRPCAddr,
		Bootstrap: pre.LogField("bootstrap socket bound", "addr"),
		Dir:       regionDir(t), Layout: sim.TestLayout(), Tick: time.Millisecond,
	}
	if cfg.Bootstrap == "" {
		t.Fatalf("prefilld logged no bootstrap address:\n%s", pre.Logs())
	}
	return pre, dec, cfg
}

// SIGTERM to prefilld while rooms are in flight: it refuses new rooms,
// lets inflight ones finish within --drain-timeout, fails the rest with
// shutdown and tells decode, then exits 0. Every room on both sides ends
// Success or Failed within the bound, and both schedulers see the
// failures.
func TestSIGTERMDrainsInflightRoomsAndTellsThePeer(t *testing.T) {
	const drain = 3 * time.Second
	pre, _, cfg := pairProcs(t, "--drain-timeout="+drain.String(), "--bootstrap-timeout=5s", "--waiting-timeout=5s", "--transfer-idle-timeout=5s")
	cfg.Requests, cfg.Concurrency = 80, 16
	cfg.PinBound = 20 * time.Second
	// A stalled prefill scheduler keeps rooms in flight when SIGTERM
	// lands: it never sends the last chunk of some rooms, which are bound
	// to decode and can only end by the drain (their deadlines are longer).
	cfg.Faults = sim.Faults{StallPrefill: 0.2}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type result struct {
		rep *sim.Report
		err error
	}
	done := make(chan result, 1)
	started := make(chan struct{})
	var once sync.Once
	cfg.Progress = func(n, _ int) {
		if n >= 5 {
			once.Do(func() { close(started) })
		}
	}
	go func() {
		rep, err := sim.Run(ctx, cfg)
		done <- result{rep, err}
	}()
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("no rooms finished within 30s")
	}
	// SIGTERM must land while a stalled room is in flight: healthy rooms
	// end in milliseconds, so a Transferring room half a second old is one.
	deadline := time.Now().Add(20 * time.Second)
	for {
		if metric(t, pre.HTTPAddr, `pdlink_room_oldest_age_seconds{side="prefill",state="Transferring"}`) >= 0.5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no stalled room in flight on prefilld")
		}
		time.Sleep(20 * time.Millisecond)
	}
	sigterm := time.Now()
	if err := pre.Stop(drain + 10*time.Second); err != nil {
		t.Fatalf("prefilld after SIGTERM: %v\n%s", err, pre.Logs())
	}
	if took := time.Since(sigterm); took > drain+5*time.Second {
		t.Errorf("prefilld took %v to stop, drain bound %v", took, drain)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	rep := r.rep
	t.Logf("outcomes %v", rep.Outcomes)
	if rep.Pinned != 0 || rep.Corrupt != 0 || rep.LateWrites != 0 {
		t.Fatalf("pinned %d corrupt %d late writes %d", rep.Pinned, rep.Corrupt, rep.LateWrites)
	}
	// The prefill scheduler sees its own rooms end, the stalled ones with
	// shutdown: they stay pollable for the terminal grace before prefilld
	// stops serving (it used to vanish while the scheduler had not looked
	// yet: unreachable). decode hears of them.
	for k, n := range rep.Outcomes {
		side, what, _ := strings.Cut(k, ":")
		ok := what == "success" || strings.HasPrefix(what, "unreachable")
		switch side {
		case "open_error":
			// New rooms are refused while draining, then the socket is gone.
			ok = what == "unavailable"
		case "prefill":
			ok = what == "success" || what == "shutdown" || what == "aborted:remote" || what == "timeout:bootstrapping"
		case "decode":
			// decode learns of prefill's shutdown (aborted:remote) or of
			// its death (peer_lost); stalled rooms time out on their own.
			ok = ok || what == "aborted:remote" || what == "peer_lost" || what == "peer_restarted" || strings.HasPrefix(what, "timeout:")
		}
		if !ok {
			t.Errorf("unexpected outcome %s x%d", k, n)
		}
	}
	if rep.Outcomes["prefill:shutdown"] == 0 {
		t.Errorf("the prefill scheduler never saw a room fail with shutdown: %v", rep.Outcomes)
	}
	if rep.Outcomes["decode:aborted:remote"] == 0 {
		t.Errorf("decode never heard of prefill's shutdown: %v", rep.Outcomes)
	}
	if !strings.Contains(pre.Logs(), `"msg":"draining"`) {
		t.Errorf("prefilld did not log its drain")
	}
}

// Found through SGLang's kill test: prefilld SIGTERMed after its decode
// peer was SIGKILLed waited its whole --drain-timeout (30 s) with nothing
// live. A room aborted after the kill had its notice out to the dead peer,
// and the drain waited for that ack until its cap. A lost peer acknowledges
// nothing; the drain ends once the peer is declared lost (heartbeats) and
// its rooms' grace is over.
func TestSIGTERMAfterThePeerWasKilledDoesNotWaitTheDrainTimeout(t *testing.T) {
	const drain = 30 * time.Second
	common := []string{"--heartbeat-interval=200ms", "--heartbeat-misses=3"}
	p := newOwnerPair(t, transfer.UniformLayout(1, 8, 4096, 4, 64), append([]string{"--drain-timeout=" + drain.String()}, common...), common)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p.open(ctx, 1)
	p.bind(ctx, 1, p.allPages())
	if err := p.dec.Kill(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.prefill.Abort(ctx, &pb.PrefillServiceAbortRequest{RoomId: 1}); err != nil {
		t.Fatal(err)
	}
	sigterm := time.Now()
	if err := p.pre.Stop(drain + 10*time.Second); err != nil {
		t.Fatalf("prefilld after SIGTERM: %v\n%s", err, p.pre.Logs())
	}
	took := time.Since(sigterm)
	t.Logf("prefilld stopped %v after SIGTERM (--drain-timeout %v)", took.Round(time.Millisecond), drain)
	// The peer is lost 600 ms after its last heartbeat; the rest is slack
	// for a loaded machine, far below the 30 s the drain used to take.
	if bound := 10 * time.Second; took > bound {
		t.Errorf("prefilld took %v to stop with nothing live and its peer killed, want within %v:\n%s", took, bound, p.pre.Logs())
	}
	if !strings.Contains(p.pre.Logs(), `"capped":false`) {
		t.Errorf("the drain ended at its cap:\n%s", p.pre.Logs())
	}
}
