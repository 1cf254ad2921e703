package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pdlink/pdlink/internal/proc"
	"github.com/pdlink/pdlink/internal/sim"
)

// A fresh pair serving healthy rooms logs no warning or error and rejects
// no control frame: an on-call engineer reads a warning as something to
// act on. Before the fix every fresh start logged prefilld's "frame
// rejected" with reason unknown_peer: the ZeroMQ dialer dropped decode's
// REGISTER, sent while its first connection was still in its handshake,
// so the first room's METADATA arrived from a peer prefill did not know
// (and that room waited for REGISTER's retransmit).
func TestAFreshPairServingHealthyRoomsLogsNoWarning(t *testing.T) {
	pre, dec, cfg := pairProcs(t)
	cfg.Requests, cfg.Concurrency, cfg.MinTokens, cfg.MaxTokens = 40, 8, 16, 64
	cfg.PinBound = 20 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	engines, err := sim.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer engines.Close()
	rep, err := engines.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Outcomes["prefill:success"] != cfg.Requests || rep.Outcomes["decode:success"] != cfg.Requests {
		t.Fatalf("not every room succeeded: %v", rep.Outcomes)
	}
	for _, d := range []*proc.Process{pre, dec} {
		// A duplicate is a retransmit that crossed its ACK (at-least-once delivery under
		// load, logged at debug): not something an operator acts on, unlike the others.
		all := metric(t, d.HTTPAddr, "pdlink_frames_rejected_total")
		if n := all - metric(t, d.HTTPAddr, `pdlink_frames_rejected_total{reason="duplicate"`); n != 0 {
			t.Errorf("%s rejected %v control frames (besides duplicates)", d.Name, n)
		}
		for _, l := range strings.Split(d.Logs(), "\n") {
			if strings.Contains(l, `"level":"warn"`) || strings.Contains(l, `"level":"error"`) {
				t.Errorf("%s logged: %s", d.Name, l)
			}
		}
	}
}
