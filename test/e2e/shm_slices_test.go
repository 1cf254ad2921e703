package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/pdlink/pdlink/internal/sim"
)

// TestShmMHAPrefillTP2ToDecodeTP4CopiesEverySliceFromPrefillsFiles: both daemons on
// --data-transport=shm (same host or nothing), MHA prefill TP 2 -> decode TP 4, so every
// stream carries head slices (each decode rank takes half of its prefill rank's heads of
// every token). Every room succeeds with every decode rank's bytes checked against the
// prefill rank the mapping names, and every byte that landed was copied by decoded from
// the prefill region files (pdlink_shm_copied_bytes_total equals the bytes landed; no
// offer refused): the slices went by shared memory, not TCP.
func TestShmMHAPrefillTP2ToDecodeTP4CopiesEverySliceFromPrefillsFiles(t *testing.T) {
	pre, dec, c := pairProcs(t, "--data-transport=shm")
	c.PrefillTP, c.DecodeTP = 2, 4
	c.Requests, c.Concurrency, c.MinTokens, c.MaxTokens = 12, 4, 16, 512
	c.PinBound = 30 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := sim.Run(ctx, c)
	if err != nil {
		t.Fatalf("sim at tp 2 -> 4 on shm: %v", err)
	}
	everyRoomVerified(t, rep)
	if n := metric(t, dec.HTTPAddr, `pdlink_shm_copied_bytes_total{side="decode"}`); n != float64(rep.Bytes) {
		t.Errorf("pdlink_shm_copied_bytes_total %v, the decode ranks landed %d bytes: some went another way", n, rep.Bytes)
	}
	for side, addr := range map[string]string{"prefill": pre.HTTPAddr, "decode": dec.HTTPAddr} {
		if n := metric(t, addr, `pdlink_shm_accepted_total{side="`+side+`"}`); n < 1 {
			t.Errorf("pdlink_shm_accepted_total on %s: %v, want at least 1", side, n)
		}
		if n := metric(t, addr, `pdlink_shm_fallback_total{`); n != 0 { // every reason, this side's
			t.Errorf("pdlink_shm_fallback_total on %s: %v, want 0", side, n)
		}
	}
	if dec.LogField("same-host pages accepted", "region") == "" {
		t.Errorf("decoded logged no accepted same-host offer; logs:\n%s", dec.Logs())
	}
}
