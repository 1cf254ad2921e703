package deploy

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// ruleFile is the part of a Prometheus rule file the tests read.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

type rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

const rulesPath = "prometheus/pdlink.rules.yml"

func readRules(t testing.TB) ruleFile {
	t.Helper()
	var rf ruleFile
	if err := yaml.UnmarshalStrict(readFile(t, rulesPath), &rf); err != nil {
		t.Fatalf("%s: %v", rulesPath, err)
	}
	return rf
}

func TestRuleExpressionsUseExportedMetrics(t *testing.T) {
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			for _, p := range checkSelectors(r.Expr) {
				t.Errorf("%s: %s", r.Alert, p)
			}
		}
	}
}

// pagers are the alerts that wake someone: a pinned room means the reaper
// is broken, and a daemon that is down or unscraped blinds every other alert.
var pagers = map[string]bool{"PdlinkRoomPastDeadline": true, "PdlinkDaemonDown": true, "PdlinkDaemonAbsent": true}

func TestRulesCarrySeverityRunbookAndNoRoomLabels(t *testing.T) {
	seen := map[string]bool{}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: recording rule %s: the deploy rules are alerts only", g.Name, r.Record)
				continue
			}
			if seen[r.Alert] {
				t.Errorf("%s defined twice", r.Alert)
			}
			seen[r.Alert] = true
			want := "ticket"
			if pagers[r.Alert] {
				want = "page"
			}
			if got := r.Labels["severity"]; got != want {
				t.Errorf("%s: severity %q, want %q", r.Alert, got, want)
			}
			for _, a := range []string{"summary", "description", "runbook"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no %s annotation", r.Alert, a)
				}
			}
			if !regexp.MustCompile(`(?m)^1\. `).MatchString(r.Annotations["runbook"]) {
				t.Errorf("%s: the runbook should start with numbered first steps", r.Alert)
			}
			if strings.Contains(strings.ToLower(r.Expr), "room_id") || strings.Contains(r.Expr, "nonce") {
				t.Errorf("%s: per-room labels do not exist and must not be grouped by", r.Alert)
			}
			// Rules on pdlink series keep the side label (no aggregation
			// that drops it).
			if strings.Contains(r.Expr, "pdlink_") && regexp.MustCompile(`\bby\s*\(`).MatchString(r.Expr) &&
				!regexp.MustCompile(`\bby\s*\([^)]*\bside\b`).MatchString(r.Expr) {
				t.Errorf("%s: aggregates away the side label", r.Alert)
			}
		}
	}
	for a := range pagers {
		if !seen[a] {
			t.Errorf("%s missing", a)
		}
	}
}

// dashboardQueries returns every PromQL query of a Grafana dashboard: panel
// targets and query variables.
func dashboardQueries(t *testing.T, b []byte) []string {
	t.Helper()
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var out []string
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, tg := range p.Targets {
				if strings.TrimSpace(tg.Expr) == "" {
					t.Errorf("panel %q has a target without expr", p.Title)
				}
				out = append(out, tg.Expr)
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		var s string
		if json.Unmarshal(v.Query, &s) != nil {
			if err := json.Unmarshal(v.Query, &q); err != nil {
				t.Fatal(err)
			}
			s = q.Query
		}
		// label_values(metric{...}, label) is Grafana's, not PromQL.
		if m := regexp.MustCompile(`^label_values\((.*),\s*\w+\)$`).FindStringSubmatch(s); m != nil {
			s = m[1]
		}
		out = append(out, s)
	}
	return out
}

type panel struct {
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

const dashboardPath = "grafana/pdlink.json"

func TestDashboardQueriesUseExportedMetrics(t *testing.T) {
	qs := dashboardQueries(t, readFile(t, dashboardPath))
	if len(qs) < 8 {
		t.Fatalf("found only %d queries in %s", len(qs), dashboardPath)
	}
	for _, q := range qs {
		for _, p := range checkSelectors(q) {
			t.Errorf("%s: %q: %s", dashboardPath, q, p)
		}
	}
	// The panels the issue asks for.
	all := strings.Join(qs, "\n")
	for _, m := range []string{"pdlink_inflight_rooms", "pdlink_rooms{", "pdlink_room_oldest_age_seconds",
		"pdlink_room_failures_total", "pdlink_transfer_bytes_total", "pdlink_peers"} {
		if !strings.Contains(all, m) {
			t.Errorf("%s has no panel on %s", dashboardPath, m)
		}
	}
}

// TestSelectorCheckCatchesMistakes proves the check fails on the mistakes it
// is for.
func TestSelectorCheckCatchesMistakes(t *testing.T) {
	for expr, bad := range map[string]bool{
		`pdlink_room_oldest_age_seconds > pdlink_room_deadline_seconds`:                                       false,
		`sum by (side, state) (pdlink_rooms{job=~"$job", state!="Success"})`:                                  false,
		`histogram_quantile(0.99, sum by (le) (rate(pdlink_room_duration_seconds_bucket[$__rate_interval])))`: false,
		`rate(pdlink_room_failures_total{reason=~"timeout:.*"}[5m]) > 0.05`:                                   false,
		`absent(up{job=~"pdlink.*"})`:                                    false,
		`rate(process_cpu_seconds_total[1m])`:                            false,
		`pdlink_room_age_seconds > 30`:                                   true, // no such metric
		`pdlink_rooms{state="transferring"}`:                             true, // states are capitalised
		`pdlink_rooms_overdue{state=~"Bootstrapping|Waiting"}`:           true, // WaitingForInput
		`rate(pdlink_room_failures_total{reason=~"timeout_.*"}[5m])`:     true, // timeout:<state>
		`rate(pdlink_room_failures_total{reason="peer_down"}[5m])`:       true,
		`pdlink_inflight_rooms{side="decoder"}`:                          true,
		`pdlink_room_duration_seconds > 1`:                               true, // a histogram has no bare series
		`ratee(pdlink_transfer_bytes_total[1m])`:                         true,
		`pdlink_inflight_rooms > 0 and on (job) pdlink_peer{state="up"}`: true,
	} {
		if got := len(checkSelectors(expr)) > 0; got != bad {
			t.Errorf("%s: flagged=%v, want %v (%q)", expr, got, bad, checkSelectors(expr))
		}
	}
}
