package testbed

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/pdlink/pdlink/internal/proc"
	"github.com/pdlink/pdlink/internal/sim"
)

// startTimeout is how long a daemon may take to log "serving" on a loaded
// machine.
const startTimeout = 30 * time.Second

// Daemon is one prefilld or decoded child that may be killed and
// restarted with the same arguments.
type Daemon struct {
	Name string
	// HTTP is the /metrics and /debug listener as first bound; Client
	// reaches it from where the test observes.
	HTTP   string
	Client *http.Client

	mu   sync.Mutex
	p    *proc.Process
	args []string // what Restart runs again, every listener pinned
}

// Options say how a suite reaches and keeps a daemon.
type Options struct {
	// Client reaches the daemon's HTTP listener (nil: a loopback client
	// with a 5 s timeout).
	Client *http.Client
	// LogDir, if set, keeps every daemon's whole log there when the test
	// ends, named after the test and the daemon.
	LogDir string
}

// Start runs command with args for the daemon name, waits until it
// serves, and pins --http-listen to the address it bound. The child is
// killed when the test ends; if the test failed its warnings and errors
// are logged.
func Start(t testing.TB, name, command string, args []string, o Options) *Daemon {
	t.Helper()
	p, err := proc.Start(context.Background(), command, args, startTimeout)
	if err != nil {
		t.Fatalf("start %s: %s %s: %v", name, command, strings.Join(args, " "), err)
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: 5 * time.Second}
		t.Cleanup(o.Client.CloseIdleConnections)
	}
	d := &Daemon{Name: name, HTTP: p.HTTPAddr, Client: o.Client, p: p, args: Pin(args, "--http-listen", p.HTTPAddr)}
	t.Cleanup(func() {
		p := d.Proc()
		select {
		case <-p.Exited():
		default:
			_ = p.Kill()
		}
		if t.Failed() {
			d.LogProblems(t)
		}
		if o.LogDir != "" {
			f := filepath.Join(o.LogDir, strings.ReplaceAll(t.Name(), "/", "_")+"."+name+".log")
			_ = os.WriteFile(f, []byte(p.Logs()), 0o644)
		}
	})
	return d
}

// Proc is the running child (the latest, after a Restart).
func (d *Daemon) Proc() *proc.Process {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.p
}

// Pin fixes flag to value in the arguments Restart runs: a port 0
// listener comes back on the port it bound.
func (d *Daemon) Pin(flag, value string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.args = Pin(d.args, flag, value)
}

// Kill9 sends SIGKILL and waits for the child to be reaped.
func (d *Daemon) Kill9() { _ = d.Proc().Kill() }

// Restart starts the daemon again with its pinned arguments, killing the
// running child first if it has not exited.
func (d *Daemon) Restart(t testing.TB) {
	t.Helper()
	d.mu.Lock()
	old, args := d.p, d.args
	d.mu.Unlock()
	p, err := old.Restart(context.Background(), args, startTimeout)
	if err != nil {
		t.Fatalf("restart %s: %v", d.Name, err)
	}
	d.mu.Lock()
	d.p = p
	d.mu.Unlock()
}

// RestartAndRegister restarts the daemon and registers s's regions with
// the new instance, as an engine does when its daemon comes back.
func (d *Daemon) RestartAndRegister(ctx context.Context, t testing.TB, s *sim.Sim) {
	t.Helper()
	d.Restart(t)
	if err := s.Register(ctx); err != nil {
		t.Fatal(err)
	}
}

// WaitLogged waits (bounded) until the daemon logged a line with message
// msg, and reports whether it did.
func (d *Daemon) WaitLogged(msg string, bound time.Duration) bool {
	_, ok := Eventually(bound, func() bool {
		return strings.Contains(d.Proc().Logs(), `"msg":"`+msg+`"`)
	})
	return ok
}

// LogProblems logs the daemon's warnings and errors (the last 40).
func (d *Daemon) LogProblems(t testing.TB) {
	var lines []string
	for _, l := range strings.Split(d.Proc().Logs(), "\n") {
		if strings.Contains(l, `"level":"warn"`) || strings.Contains(l, `"level":"error"`) {
			lines = append(lines, l)
		}
	}
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	t.Logf("%s warnings and errors (last %d):\n%s", d.Name, len(lines), strings.Join(lines, "\n"))
}

// Pin returns args with flag's value replaced by value.
func Pin(args []string, flag, value string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		if strings.HasPrefix(a, flag+"=") {
			out[i] = flag + "=" + value
		}
	}
	return out
}

// Scrape reads the daemon's /metrics.
func (d *Daemon) Scrape() (map[string]*dto.MetricFamily, error) {
	resp, err := d.Client.Get("http://" + d.HTTP + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// Metric scrapes one value: the sum of name's samples whose labels
// include labels (-1 when the daemon does not answer).
func (d *Daemon) Metric(name string, labels map[string]string) float64 {
	mfs, err := d.Scrape()
	if err != nil {
		return -1
	}
	return Sum(mfs, name, labels)
}

// Sum adds the samples of name whose labels include want.
func Sum(mfs map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	var v float64
	for _, m := range mfs[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		ok := true
		for k, w := range want {
			got, found := have[k]
			ok = ok && found && got == w
		}
		if ok {
			v += m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetUntyped().GetValue()
		}
	}
	return v
}

// DebugRoom is a room as /debug/rooms lists it.
type DebugRoom struct {
	Room    uint64 `json:"room"`
	State   string `json:"state"`
	Visible string `json:"visible_state"`
	Reason  string `json:"reason"`
}

// Rooms reads the daemon's /debug/rooms.
func (d *Daemon) Rooms() ([]DebugRoom, error) {
	resp, err := d.Client.Get("http://" + d.HTTP + "/debug/rooms?limit=100000")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var out struct {
		Rooms []DebugRoom `json:"rooms"`
	}
	return out.Rooms, json.Unmarshal(b, &out)
}

// Live reports whether a room in state has not ended.
func Live(state string) bool { return state != "Success" && state != "Failed" }
