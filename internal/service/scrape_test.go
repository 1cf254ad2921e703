package service

import (
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pdlink/pdlink/pkg/metrics"
)

// Every metric of DESIGN.md section 7 (metrics.Names) is on a real daemon's
// /metrics, with its type and the side label, on both daemons.
func TestScrapeHasEveryMetricWithItsType(t *testing.T) {
	p := startPair(t)
	for side, base := range map[string]string{"prefill": p.preHTTP, "decode": p.decHTTP} {
		parser := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := parser.TextToMetricFamilies(strings.NewReader(httpGet(t, base+"/metrics")))
		if err != nil {
			t.Fatalf("%s: /metrics does not parse: %v", side, err)
		}
		for name, typ := range metrics.Names() {
			mf, ok := mfs[name]
			if !ok {
				t.Errorf("%s: %s missing", side, name)
				continue
			}
			if got := strings.ToLower(mf.GetType().String()); got != typ {
				t.Errorf("%s: %s is %s, want %s", side, name, got, typ)
			}
			for _, m := range mf.GetMetric() {
				found := false
				for _, l := range m.GetLabel() {
					if l.GetName() == "side" && l.GetValue() == side {
						found = true
					}
				}
				if !found {
					t.Errorf("%s: %s sample without side=%q", side, name, side)
				}
			}
		}
		if got := labelOf(mfs["pdlink_data_transport_info"], "transport"); got != "auto" {
			t.Errorf("%s: pdlink_data_transport_info transport=%q, want the default --data-transport auto", side, got)
		}
		for _, want := range []string{"go_goroutines", "process_resident_memory_bytes"} {
			if _, ok := mfs[want]; !ok {
				t.Errorf("%s: %s missing (Go/process collectors)", side, want)
			}
		}
	}
}

// labelOf is the value of label name on the family's only sample, "" when there is none.
func labelOf(mf *dto.MetricFamily, name string) string {
	if mf == nil || len(mf.GetMetric()) != 1 {
		return ""
	}
	for _, l := range mf.GetMetric()[0].GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
