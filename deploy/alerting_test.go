package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"sigs.k8s.io/yaml"

	"github.com/pdlink/pdlink/pkg/metrics"
	"github.com/pdlink/pdlink/pkg/poll"
)

// decodeExporter serves what a decode daemon's /metrics serves: the real
// collector over an empty room table, with every source set. pinned swaps
// in one line: the oldest WaitingForInput room three deadlines old, which a
// daemon whose reaper runs never reports.
type decodeExporter struct {
	pinned atomic.Bool
	reg    *prometheus.Registry
	wait   time.Duration
}

func newDecodeExporter(t *testing.T) *decodeExporter {
	t.Helper()
	cfg := poll.DefaultConfig(poll.Decode)
	tbl, err := poll.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	reg := prometheus.NewRegistry()
	col := metrics.NewCollector(metrics.SideDecode, metrics.Sources{
		Rooms: func() poll.Stats {
			mu.Lock()
			defer mu.Unlock()
			return tbl.Stats(time.Now().UnixNano())
		},
		Frames:         func() []metrics.Count { return []metrics.Count{{Labels: []string{"metadata", "out"}, Value: 1}} },
		FramesRejected: func() []metrics.Count { return []metrics.Count{{Labels: []string{"decode"}, Value: 0}} },
		Retransmits:    func() float64 { return 0 },
		Peers: func() []metrics.Count {
			return []metrics.Count{{Labels: []string{"up"}, Value: 1}, {Labels: []string{"lost"}, Value: 0}}
		},
		WorkerRestarts: func() []metrics.Count { return []metrics.Count{{Labels: []string{"receiver"}, Value: 0}} },
		TransferBytes:  func() float64 { return 0 },
		InsecureMode:   func() float64 { return 1 },
	})
	if err := metrics.Register(reg, col, metrics.NewRecorder(metrics.SideDecode)); err != nil {
		t.Fatal(err)
	}
	bi := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pdlink_build_info", Help: "build"}, []string{"side", "version"})
	bi.WithLabelValues(metrics.SideDecode, "test").Set(1)
	reg.MustRegister(bi, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return &decodeExporter{reg: reg, wait: cfg.WaitingTimeout}
}

var waitingAgeLine = regexp.MustCompile(`(?m)^pdlink_room_oldest_age_seconds\{side="decode",state="WaitingForInput"\} \S+$`)

func (e *decodeExporter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Plain text, so the pinned line can be swapped in.
	r = r.Clone(r.Context())
	r.Header.Del("Accept-Encoding")
	r.Header.Set("Accept", "text/plain;version=0.0.4")
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{}).ServeHTTP(rec, r)
	if !waitingAgeLine.Match(rec.Body.Bytes()) {
		http.Error(w, "exporter: no WaitingForInput age line to pin", http.StatusInternalServerError)
		return
	}
	body := rec.Body.Bytes()
	if e.pinned.Load() {
		line := fmt.Sprintf(`pdlink_room_oldest_age_seconds{side="decode",state="WaitingForInput"} %g`, 3*e.wait.Seconds())
		body = waitingAgeLine.ReplaceAll(body, []byte(line))
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = w.Write(body)
}

// promAPI is a small client of Prometheus' HTTP API.
type promAPI struct{ base string }

func (p promAPI) get(ctx context.Context, path string, q url.Values, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return fmt.Errorf("%s: HTTP %d: %v", path, resp.StatusCode, err)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s %v: %s", path, q, env.Error)
	}
	if into == nil {
		return nil
	}
	return json.Unmarshal(env.Data, into)
}

type promAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"`
}

func (p promAPI) alerts(ctx context.Context, name string) ([]promAlert, error) {
	var data struct {
		Alerts []promAlert `json:"alerts"`
	}
	if err := p.get(ctx, "/api/v1/alerts", nil, &data); err != nil {
		return nil, err
	}
	var out []promAlert
	for _, a := range data.Alerts {
		if a.Labels["alertname"] == name {
			out = append(out, a)
		}
	}
	return out, nil
}

// eventually polls cond every 200ms until it returns true or ctx ends.
func eventually(ctx context.Context, t *testing.T, what string, cond func() (bool, error)) {
	t.Helper()
	var last error
	for {
		ok, err := cond()
		if ok {
			return
		}
		last = err
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not within the deadline (last error: %v)", what, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// fastRules returns the rule file with every for: cut to 2s, so the test
// sees pending then firing within seconds; the expressions are untouched.
func fastRules(t *testing.T) []byte {
	t.Helper()
	var rf map[string]any
	if err := yaml.Unmarshal(readFile(t, rulesPath), &rf); err != nil {
		t.Fatal(err)
	}
	for _, g := range rf["groups"].([]any) {
		for _, r := range g.(map[string]any)["rules"].([]any) {
			if rm := r.(map[string]any); rm["for"] != nil {
				rm["for"] = "2s"
			}
		}
	}
	b, err := yaml.Marshal(rf)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// startPrometheus runs a real Prometheus on a free loopback port with
// dir/prometheus.yml and its data in dir/data; it is killed when the test
// ends, and its log is shown if the test failed. done closes if it exits.
func startPrometheus(ctx context.Context, t *testing.T, promBin, dir string) (api promAPI, done <-chan struct{}, logs func() string) {
	t.Helper()
	addr := freePort(t)
	var buf bytes.Buffer
	var mu sync.Mutex
	cmd := exec.CommandContext(ctx, promBin,
		"--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn")
	w := lockedWriter{mu: &mu, w: &buf}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	logs = func() string { mu.Lock(); defer mu.Unlock(); return buf.String() }
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("prometheus log:\n%s", logs())
		}
	})
	return promAPI{base: "http://" + addr}, exited, logs
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestAlertFiresAndResolvesInPrometheus runs a real Prometheus on loopback
// with the deploy rules (for: shortened to 2s), scraping an exporter that
// serves a decode daemon's real metrics every second. Healthy: no pin alert.
// Pinned (a WaitingForInput room past its deadline): PdlinkRoomPastDeadline
// fires with side, state and severity=page. Healthy again: it resolves. On
// the way every rule expression and dashboard query goes through
// Prometheus' own parser.
func TestAlertFiresAndResolvesInPrometheus(t *testing.T) {
	t.Parallel()
	promBin := tool(t, "prometheus", "prometheus")
	ctx, cancel := context.WithTimeout(context.Background(), 55*time.Second)
	defer cancel()

	exp := newDecodeExporter(t)
	ts := httptest.NewUnstartedServer(exp)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts.Listener = l
	ts.Start()
	defer ts.Close()

	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 900ms
  evaluation_interval: 1s
rule_files: [pdlink.rules.yml]
scrape_configs:
  - job_name: pdlink-decode
    static_configs:
      - targets: [%q]
`, strings.TrimPrefix(ts.URL, "http://"))
	for name, b := range map[string][]byte{"prometheus.yml": []byte(cfg), "pdlink.rules.yml": fastRules(t)} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	api, done, logs := startPrometheus(ctx, t, promBin, dir)

	eventually(ctx, t, "prometheus ready and scraping the exporter", func() (bool, error) {
		select {
		case <-done:
			t.Fatalf("prometheus exited:\n%s", logs())
		default:
		}
		var res struct {
			Result []json.RawMessage `json:"result"`
		}
		if err := api.get(ctx, "/api/v1/query", url.Values{"query": {`up{job="pdlink-decode"} == 1`}}, &res); err != nil {
			return false, err
		}
		return len(res.Result) == 1, nil
	})

	t.Run("every rule and dashboard query parses in Prometheus", func(t *testing.T) {
		var exprs []string
		for _, g := range readRules(t).Groups {
			for _, r := range g.Rules {
				exprs = append(exprs, r.Expr)
			}
		}
		grafanaVars := strings.NewReplacer("$__rate_interval", "1m", "$job", ".*", "$instance", ".*")
		for _, q := range dashboardQueries(t, readFile(t, dashboardPath)) {
			exprs = append(exprs, grafanaVars.Replace(q))
		}
		for _, e := range exprs {
			if err := api.get(ctx, "/api/v1/query", url.Values{"query": {e}}, nil); err != nil {
				t.Errorf("%q: %v", e, err)
			}
		}
	})

	// Healthy: several evaluations with no pin alert, not even pending.
	for i := 0; i < 4; i++ {
		time.Sleep(time.Second)
		as, err := api.alerts(ctx, "PdlinkRoomPastDeadline")
		if err != nil {
			t.Fatal(err)
		}
		if len(as) > 0 {
			t.Fatalf("healthy daemon raised %+v", as)
		}
	}

	exp.pinned.Store(true)
	var fired promAlert
	eventually(ctx, t, "PdlinkRoomPastDeadline firing", func() (bool, error) {
		as, err := api.alerts(ctx, "PdlinkRoomPastDeadline")
		for _, a := range as {
			if a.State == "firing" {
				fired = a
				return true, nil
			}
		}
		return false, err
	})
	for k, v := range map[string]string{"side": "decode", "state": "WaitingForInput", "severity": "page", "job": "pdlink-decode"} {
		if fired.Labels[k] != v {
			t.Errorf("firing alert label %s=%q, want %q (labels %v)", k, fired.Labels[k], v, fired.Labels)
		}
	}
	if !strings.Contains(fired.Annotations["runbook"], "/debug/rooms?state=WaitingForInput") {
		t.Errorf("runbook not rendered for the room's state: %q", fired.Annotations["runbook"])
	}

	exp.pinned.Store(false)
	eventually(ctx, t, "PdlinkRoomPastDeadline resolved", func() (bool, error) {
		as, err := api.alerts(ctx, "PdlinkRoomPastDeadline")
		return err == nil && len(as) == 0, err
	})
}
