package twohost

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/pdlink/pdlink/internal/testbed"
)

// prometheus is the Debian prometheus binary running on a test host; its
// API is reached from inside that host.
type prometheus struct {
	host *host
	base string
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startPrometheus runs Prometheus inside h, scraping every target (job
// name to host:port) each second, and waits until it is ready. It is
// killed when the test ends; its log is shown if the test failed.
func startPrometheus(t *testing.T, h *host, targets map[string]string) *prometheus {
	t.Helper()
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skipf("skipping: prometheus not installed (scripts/deps.sh installs it): %v", err)
	}
	dir := t.TempDir()
	cfg := "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n"
	jobs := make([]string, 0, len(targets))
	for job := range targets {
		jobs = append(jobs, job)
	}
	slices.Sort(jobs)
	for _, job := range jobs {
		cfg += fmt.Sprintf("  - job_name: %s\n    static_configs: [{targets: [%q]}]\n", job, targets[job])
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	name, args := h.command(promBin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+promListen, "--log.level=warn")
	cmd := exec.Command(name, args...)
	logs := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("prometheus log:\n%s", logs.String())
		}
	})
	p := &prometheus{host: h, base: "http://" + promListen}
	if _, ok := testbed.Eventually(30*time.Second, func() bool {
		resp, err := h.client.Get(p.base + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}); !ok {
		t.Fatalf("prometheus in %s not ready within 30s:\n%s", h.ns, logs.String())
	}
	return p
}

// sample is one series of an instant query's result.
type sample struct {
	Labels map[string]string
	Value  float64
}

// query runs an instant PromQL query through the HTTP API.
func (p *prometheus) query(q string) ([]sample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+"/api/v1/query?"+url.Values{"query": {q}}.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.host.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var env struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&env); err != nil {
		return nil, fmt.Errorf("query %s: HTTP %d: %v", q, resp.StatusCode, err)
	}
	if env.Status != "success" {
		return nil, fmt.Errorf("query %s: %s", q, env.Error)
	}
	out := make([]sample, 0, len(env.Data.Result))
	for _, r := range env.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("query %s: value %v: %v", q, r.Value, err)
		}
		out = append(out, sample{Labels: r.Metric, Value: v})
	}
	return out, nil
}

// waitQuery polls q until every series of its result satisfies ok and
// there are want of them, or bound passes; it returns the last result.
func (p *prometheus) waitQuery(t *testing.T, q string, want int, bound time.Duration, ok func(sample) bool) []sample {
	t.Helper()
	var last []sample
	var lastErr error
	if _, held := testbed.Eventually(bound, func() bool {
		last, lastErr = p.query(q)
		if lastErr != nil || len(last) != want {
			return false
		}
		for _, s := range last {
			if !ok(s) {
				return false
			}
		}
		return true
	}); !held {
		t.Fatalf("prometheus: %s gave %+v (error %v) for %v, want %d series that hold", q, last, lastErr, bound, want)
	}
	return last
}
