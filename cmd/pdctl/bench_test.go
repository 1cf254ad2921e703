package main

import (
	"encoding/json"
	"testing"
)

// An iperf3 run that moved nothing is no reference: with a zero rate the
// ratio to it was +Inf and `pdctl bench --json` failed ("json: unsupported
// value: +Inf") in about one run of fifteen on this machine.
func TestIperf3RunThatMovedNothingIsNoReference(t *testing.T) {
	for _, out := range []string{
		`{"start":{},"intervals":[],"end":{}}`,
		`{"end":{"sum_received":{"bits_per_second":0}}}`,
		`{"end":{},"error":"the server is busy running a test. try again later"}`,
	} {
		if g, err := iperf3Rate([]byte(out)); err == nil {
			t.Errorf("iperf3 output %s gave a reference of %v GB/s, want no reference", out, g)
		}
	}
	g, err := iperf3Rate([]byte(`{"end":{"sum_received":{"bits_per_second":32e9}}}`))
	if err != nil || g != 4 {
		t.Errorf("iperf3 at 32 Gbit/s gave %v GB/s (%v), want 4", g, err)
	}
	if _, err := json.Marshal(benchResult{VsIperf3: 1 / g}); err != nil {
		t.Errorf("a result with a measured reference does not encode: %v", err)
	}
}
