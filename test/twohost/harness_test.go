package twohost

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
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

// The daemons listen where a deployment puts them: the README's default
// ports, on the veth addresses. decoded's data listener is the wildcard,
// so the address prefill dials is the one --data-advertise names.
var (
	bootstrapAddr = "tcp://" + prefillIP + ":8998"
	prefillHTTP   = prefillIP + ":9400"
	decodeHTTP    = decodeIP + ":9401"
	dataListen    = "0.0.0.0:9500"
	dataAdvertise = decodeIP + ":9500"
	// promListen is inside the prefill namespace, where Prometheus runs.
	promListen = "127.0.0.1:9090"
)

// timings are the daemons' deadlines: short, so a room cut off from its
// peer fails in seconds and the suite stays fast.
type timings struct {
	bootstrap, waiting, idle, linger, heartbeat time.Duration
	misses                                      int
}

// The linger outlasts knownStallBound, so a room failed while prefilld's
// owner is stalled is not reaped before its scheduler could see Failed.
var shortTimings = timings{bootstrap: 2 * time.Second, waiting: 2 * time.Second, idle: 2 * time.Second,
	linger: 8 * time.Second, heartbeat: 200 * time.Millisecond, misses: 3}

func (tm timings) args() []string {
	return []string{
		"--bootstrap-timeout=" + tm.bootstrap.String(), "--waiting-timeout=" + tm.waiting.String(),
		"--transfer-idle-timeout=" + tm.idle.String(), "--clear-linger=" + tm.linger.String(),
		"--heartbeat-interval=" + tm.heartbeat.String(), fmt.Sprintf("--heartbeat-misses=%d", tm.misses),
		"--drain-timeout=1s", "--log-level=info",
	}
}

// peerBound is how long a lost peer may go unnoticed: the missed
// heartbeats, a tick of the daemon, and the observer's own polling.
func (tm timings) peerBound() time.Duration {
	return time.Duration(tm.misses)*tm.heartbeat + time.Second
}

// roomBound is the longest any room may take to reach a terminal state:
// each state's deadline in turn, a lost peer, and slack for the
// schedulers' ticks and a loaded 2-core machine.
func (tm timings) roomBound() time.Duration {
	return tm.bootstrap + tm.waiting + tm.idle + tm.peerBound() + 2*time.Second
}

// daemon is one daemon process on a test host; it may be killed and
// restarted with the same arguments (every port is fixed).
type daemon struct {
	name string
	host *host
	http string
	mu   sync.Mutex
	p    *proc.Process
}

func (d *daemon) proc() *proc.Process {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.p
}

func (d *daemon) kill9() { _ = d.proc().Kill() }

func (d *daemon) restart(t *testing.T) {
	t.Helper()
	p, err := d.proc().Restart(context.Background(), nil, 30*time.Second)
	if err != nil {
		t.Fatalf("restart %s: %v", d.name, err)
	}
	d.mu.Lock()
	d.p = p
	d.mu.Unlock()
}

// startDaemon runs bin(name) inside h with args; it is killed when the
// test ends, and its warnings are logged if the test failed.
func startDaemon(t *testing.T, h *host, name string, args ...string) *daemon {
	t.Helper()
	cmd, argv := h.command(bin(name), args...)
	p, err := proc.Start(context.Background(), cmd, argv, 30*time.Second)
	if err != nil {
		t.Fatalf("start %s in %s: %v", name, h.ns, err)
	}
	d := &daemon{name: name, host: h, http: p.HTTPAddr, p: p}
	t.Cleanup(func() {
		p := d.proc()
		select {
		case <-p.Exited():
		default:
			_ = p.Kill()
		}
		if t.Failed() {
			d.logProblems(t)
		}
		if dir := os.Getenv("PDLINK_TWOHOST_LOGDIR"); dir != "" {
			f := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"."+name+".log")
			_ = os.WriteFile(f, []byte(d.proc().Logs()), 0o644)
		}
	})
	return d
}

// logProblems logs the daemon's warnings and errors (the last 40).
func (d *daemon) logProblems(t *testing.T) {
	var lines []string
	for _, l := range strings.Split(d.proc().Logs(), "\n") {
		if strings.Contains(l, `"level":"warn"`) || strings.Contains(l, `"level":"error"`) {
			lines = append(lines, l)
		}
	}
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	t.Logf("%s warnings and errors (last %d):\n%s", d.name, len(lines), strings.Join(lines, "\n"))
}

// tokenFile writes a fresh 32-byte shared token, hex-encoded, mode 0600.
func tokenFile(t *testing.T) string {
	t.Helper()
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(hex.EncodeToString(b)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// cluster is prefilld on the prefill host and decoded on the decode host,
// sharing a token, the simulated engines (in the root namespace, on the
// daemons' unix sockets and region files) and, optionally, Prometheus on
// the prefill host scraping both daemons.
type cluster struct {
	t          *testing.T
	tm         timings
	pre, dec   *daemon
	preH, decH *host
	sim        *sim.Sim
	prom       *prometheus
	baseline   map[string]float64 // go_goroutines after the warm-up
}

type clusterOpts struct {
	prometheus bool
	// smallSocketBuffers caps TCP send buffers on the prefill host and
	// receive buffers on the decode host at 16 KiB, so pages are always
	// in flight in a blocked write.
	smallSocketBuffers bool
}

// daemonArgs are each daemon's arguments with the shared token file and
// the unix socket its engine uses under dir.
func daemonArgs(tm timings, dir, token string) (pre, dec []string) {
	pre = append([]string{"--grpc-listen=unix://" + filepath.Join(dir, "prefilld.sock"), "--http-listen=" + prefillHTTP,
		"--bootstrap-listen=" + bootstrapAddr}, tm.args()...)
	dec = append([]string{"--grpc-listen=unix://" + filepath.Join(dir, "decoded.sock"), "--http-listen=" + decodeHTTP,
		"--data-listen=" + dataListen, "--data-advertise=" + dataAdvertise}, tm.args()...)
	if token != "" {
		pre = append(pre, "--auth-token-file="+token)
		dec = append(dec, "--auth-token-file="+token)
	}
	return pre, dec
}

func newCluster(t *testing.T, o clusterOpts) *cluster {
	t.Helper()
	preH, decH := newHosts(t)
	return newClusterOn(t, preH, decH, o)
}

// newClusterOn starts the daemons (and Prometheus) on hosts made by
// newHosts.
func newClusterOn(t *testing.T, preH, decH *host, o clusterOpts) *cluster {
	t.Helper()
	c := &cluster{t: t, tm: shortTimings, preH: preH, decH: decH}
	if o.smallSocketBuffers {
		preH.sysctl(t, "net.ipv4.tcp_wmem", "4096 8192 16384")
		decH.sysctl(t, "net.ipv4.tcp_rmem", "4096 8192 16384")
	}
	dir := t.TempDir()
	preArgs, decArgs := daemonArgs(c.tm, dir, tokenFile(t))
	c.pre = startDaemon(t, preH, "prefilld", preArgs...)
	c.dec = startDaemon(t, decH, "decoded", decArgs...)
	if got := c.pre.proc().LogField("bootstrap socket bound", "addr"); got != bootstrapAddr {
		t.Fatalf("prefilld bound its bootstrap socket on %q, want %q", got, bootstrapAddr)
	}
	if o.prometheus {
		c.prom = startPrometheus(t, preH, map[string]string{"pdlink-prefill": prefillHTTP, "pdlink-decode": decodeHTTP})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := sim.New(ctx, sim.Config{
		PrefillGRPC: "unix://" + c.pre.proc().GRPCAddr, DecodeGRPC: "unix://" + c.dec.proc().GRPCAddr,
		Bootstrap: bootstrapAddr, Dir: dir, Layout: layout(),
	})
	if err != nil {
		t.Fatal(err)
	}
	c.sim = s
	t.Cleanup(s.Close)

	// Warm up: the control session and the data connections across the
	// veth exist from here on, so the goroutine baseline counts them.
	rep := c.run(ctx, c.workload(12, 4))
	if rep.Outcomes["decode:success"] != 12 || rep.Outcomes["prefill:success"] != 12 || rep.Corrupt != 0 {
		t.Fatalf("warm-up across the veth: %v", rep.Outcomes)
	}
	c.baseline = map[string]float64{}
	for _, d := range c.daemons() {
		c.baseline[d.name] = c.metric(d, "go_goroutines", nil)
	}
	return c
}

// layout is a small model with many pages, so a hundred small requests
// fit in flight at once: 4 buffers of 2048 pages of 4 KiB.
func layout() sim.Layout {
	return sim.Layout{Layers: 2, PageTokens: 16, BytesPerToken: 1 << 10, Pages: 2048, AuxRows: 1024, AuxRowLen: 64}
}

// workload is n requests of 1..8 pages, at most conc in flight, polled
// every 20 ms, every byte checked.
func (c *cluster) workload(n, conc int) sim.Config {
	return sim.Config{Requests: n, Concurrency: conc, MinTokens: 16, MaxTokens: 128, ChunkPages: 2,
		Tick: 20 * time.Millisecond, PinBound: c.tm.roomBound(), Seed: uint64(time.Now().UnixNano()), CheckPages: true}
}

func (c *cluster) daemons() []*daemon { return []*daemon{c.pre, c.dec} }

func (c *cluster) run(ctx context.Context, w sim.Config) *sim.Report {
	c.t.Helper()
	rep, err := c.sim.Run(ctx, w)
	if err != nil {
		c.t.Fatalf("sim: %v", err)
	}
	return rep
}

// scrape reads a daemon's /metrics from inside its own host.
func (c *cluster) scrape(d *daemon) (map[string]*dto.MetricFamily, error) {
	resp, err := d.host.client.Get("http://" + d.http + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// sum adds the samples of name whose labels include want.
func sum(mfs map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	var v float64
	for _, m := range mfs[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		ok := true
		for k, w := range want {
			ok = ok && have[k] == w
		}
		if !ok {
			continue
		}
		v += m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetUntyped().GetValue()
	}
	return v
}

// metric scrapes one value (-1 when the daemon does not answer).
func (c *cluster) metric(d *daemon, name string, labels map[string]string) float64 {
	mfs, err := c.scrape(d)
	if err != nil {
		return -1
	}
	return sum(mfs, name, labels)
}

type debugRoom struct {
	Room    uint64 `json:"room"`
	State   string `json:"state"`
	Visible string `json:"visible_state"`
	Reason  string `json:"reason"`
}

// rooms reads a daemon's /debug/rooms from inside its own host.
func (c *cluster) rooms(d *daemon) ([]debugRoom, error) {
	resp, err := d.host.client.Get("http://" + d.http + "/debug/rooms?limit=100000")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var out struct {
		Rooms []debugRoom `json:"rooms"`
	}
	return out.Rooms, json.Unmarshal(b, &out)
}

func live(state string) bool { return state != "Success" && state != "Failed" }

// eventually polls cond every 50 ms until it holds or bound passes; it
// returns how long it took and whether it held.
func eventually(bound time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > bound {
			return time.Since(start), false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// liveRooms returns the rooms d holds that its scheduler does not see
// terminal yet, with their state.
func (c *cluster) liveRooms(d *daemon) map[uint64]string {
	c.t.Helper()
	rs, err := c.rooms(d)
	if err != nil {
		c.t.Fatalf("%s /debug/rooms: %v", d.name, err)
	}
	out := map[uint64]string{}
	for _, r := range rs {
		if live(r.Visible) {
			out[r.Room] = r.Visible
		}
	}
	return out
}

// tablesEmpty waits (bounded) for both daemons to hold no room.
func (c *cluster) tablesEmpty(bound time.Duration) []string {
	var leaks []string
	for _, d := range c.daemons() {
		var last string
		if _, ok := eventually(bound, func() bool {
			mfs, err := c.scrape(d)
			if err != nil {
				last = err.Error()
				return false
			}
			held, inflight := sum(mfs, "pdlink_rooms", nil), sum(mfs, "pdlink_inflight_rooms", nil)
			if held != 0 || inflight != 0 {
				last = fmt.Sprintf("%s holds %v rooms (%v inflight)", d.name, held, inflight)
				return false
			}
			return true
		}); !ok {
			leaks = append(leaks, last)
		}
	}
	return leaks
}

// goroutinesBack waits (bounded) for each daemon's go_goroutines to come
// back within a small margin of its baseline.
func (c *cluster) goroutinesBack(bound time.Duration) []string {
	var leaks []string
	for _, d := range c.daemons() {
		base := c.baseline[d.name]
		limit := base + max(8, base/10)
		var last float64
		if _, ok := eventually(bound, func() bool {
			last = c.metric(d, "go_goroutines", nil)
			return last >= 0 && last <= limit
		}); !ok {
			leaks = append(leaks, fmt.Sprintf("%s: %v goroutines, baseline %v", d.name, last, base))
		}
	}
	return leaks
}

// check asserts what every scenario must end with: no room pinned, every
// room terminal within the bound, every Success verified byte for byte,
// no write after Failed, only allowed outcomes, empty tables and no
// goroutine leak once the schedulers cleared.
func (c *cluster) check(rep *sim.Report, allowed func(outcome string) bool) {
	t := c.t
	t.Helper()
	bound := c.tm.roomBound()
	if rep.Pinned != 0 || rep.WorstTerminal > bound {
		t.Errorf("%d rooms pinned; worst time to terminal %v, bound %v", rep.Pinned, rep.WorstTerminal, bound)
	}
	if rep.Corrupt != 0 || rep.LateWrites != 0 || rep.Crossed != 0 {
		t.Errorf("%d successful rooms with a wrong byte, %d failed rooms written after Failed (R7), %d requests' pages written by another", rep.Corrupt, rep.LateWrites, rep.Crossed)
	}
	if rep.Verified == 0 {
		t.Errorf("no room succeeded and was verified")
	}
	for k, n := range rep.Outcomes {
		if !allowed(k) {
			t.Errorf("unexpected outcome %s x%d", k, n)
		}
	}
	leaks := c.tablesEmpty(c.tm.linger + 5*time.Second)
	leaks = append(leaks, c.goroutinesBack(15*time.Second)...)
	for _, l := range leaks {
		t.Errorf("leak: %s", l)
	}
	t.Logf("%d rooms in %v; %s; worst time to terminal %v (bound %v); verified %d, corrupt %d, late writes %d, crossed %d",
		rep.Requests, rep.Elapsed.Round(time.Millisecond), outcomes(rep), rep.WorstTerminal.Round(time.Millisecond), bound,
		rep.Verified, rep.Corrupt, rep.LateWrites, rep.Crossed)
}

func outcomes(rep *sim.Report) string {
	keys := make([]string, 0, len(rep.Outcomes))
	for k := range rep.Outcomes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s=%d", k, rep.Outcomes[k])
	}
	return b.String()
}

// merge adds b's counts to a (a scenario in several phases).
func merge(a, b *sim.Report) *sim.Report {
	a.Requests += b.Requests
	for k, v := range b.Outcomes {
		a.Outcomes[k] += v
	}
	a.Verified += b.Verified
	a.Corrupt += b.Corrupt
	a.LateWrites += b.LateWrites
	a.Crossed += b.Crossed
	a.Pinned += b.Pinned
	a.Elapsed += b.Elapsed
	a.WorstTerminal = max(a.WorstTerminal, b.WorstTerminal)
	return a
}
