package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"

	"github.com/pdlink/pdlink/internal/proc"
	"github.com/pdlink/pdlink/internal/sim"
)

// timings are the daemons' deadlines: short, so a stuck room fails in
// seconds and the suite stays fast.
type timings struct {
	bootstrap, waiting, idle, linger, heartbeat time.Duration
	misses                                      int
}

func shortTimings() timings {
	return timings{bootstrap: 2 * time.Second, waiting: 2 * time.Second, idle: 2 * time.Second,
		linger: 3 * time.Second, heartbeat: 200 * time.Millisecond, misses: 3}
}

func (tm timings) args() []string {
	return []string{
		"--bootstrap-timeout=" + tm.bootstrap.String(), "--waiting-timeout=" + tm.waiting.String(),
		"--transfer-idle-timeout=" + tm.idle.String(), "--clear-linger=" + tm.linger.String(),
		"--heartbeat-interval=" + tm.heartbeat.String(), fmt.Sprintf("--heartbeat-misses=%d", tm.misses),
		"--drain-timeout=1s", "--log-level=info",
	}
}

// peerBound is how long a peer's death may go unnoticed: the missed
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

// daemon is one child process that may be killed and restarted on the
// same addresses.
type daemon struct {
	name string
	mu   sync.Mutex
	p    *proc.Process
	args []string // every listener pinned to its first address
	http string
}

func (d *daemon) proc() *proc.Process {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.p
}

// kill9 sends SIGKILL and waits for the child to be reaped.
func (d *daemon) kill9() { _ = d.proc().Kill() }

func (d *daemon) restart(t *testing.T) {
	t.Helper()
	p, err := d.proc().Restart(context.Background(), d.args, 30*time.Second)
	if err != nil {
		t.Fatalf("restart %s: %v", d.name, err)
	}
	d.mu.Lock()
	d.p = p
	d.mu.Unlock()
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

// pin replaces flag's value in args.
func pin(args []string, flag, value string) []string {
	out := slices.Clone(args)
	for i, a := range out {
		if strings.HasPrefix(a, flag+"=") {
			out[i] = flag + "=" + value
		}
	}
	return out
}

func startDaemon(t *testing.T, name string, args []string) *daemon {
	t.Helper()
	p, err := proc.Start(context.Background(), bin(name), args, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{name: name, p: p, http: p.HTTPAddr, args: pin(args, "--http-listen", p.HTTPAddr)}
	t.Cleanup(func() {
		if t.Failed() {
			d.logProblems(t)
		}
		if dir := os.Getenv("PDLINK_CHAOS_LOGDIR"); dir != "" {
			f := filepath.Join(dir, strings.ReplaceAll(t.Name(), "/", "_")+"."+name+".log")
			_ = os.WriteFile(f, []byte(d.proc().Logs()), 0o644)
		}
		if p := d.proc(); p != nil {
			select {
			case <-p.Exited():
			default:
				_ = p.Kill()
			}
		}
	})
	return d
}

// cluster is a prefilld and a decoded on loopback, optionally with a
// Toxiproxy proxy on the control link (decode -> prefill bootstrap) and
// one on the data link (prefill -> decode data), and the simulated
// engines registered with both.
type cluster struct {
	t         *testing.T
	tm        timings
	pre, dec  *daemon
	bootstrap string // prefilld's bound address, tcp://host:port
	data      string // decoded's bound data address
	ctl, dat  *toxiproxy.Proxy
	sim       *sim.Sim
	cfg       sim.Config
	baseline  map[string]float64 // go_goroutines after the warm-up
	client    *http.Client
}

type clusterOpts struct {
	tm      timings
	proxies bool
}

func newCluster(t *testing.T, o clusterOpts) *cluster {
	t.Helper()
	if o.tm == (timings{}) {
		o.tm = shortTimings()
	}
	dir := t.TempDir()
	c := &cluster{t: t, tm: o.tm, client: &http.Client{Timeout: 5 * time.Second}}
	t.Cleanup(c.client.CloseIdleConnections)

	common := append([]string{"--http-listen=127.0.0.1:0"}, o.tm.args()...)
	c.pre = startDaemon(t, "prefilld", append([]string{"--grpc-listen=unix://" + filepath.Join(dir, "prefilld.sock"),
		"--bootstrap-listen=tcp://127.0.0.1:0"}, common...))
	c.bootstrap = c.pre.proc().LogField("bootstrap socket bound", "addr")
	if c.bootstrap == "" {
		t.Fatalf("prefilld logged no bootstrap address:\n%s", c.pre.proc().Logs())
	}
	c.pre.args = pin(c.pre.args, "--bootstrap-listen", c.bootstrap)
	roomBootstrap := c.bootstrap

	decArgs := append([]string{"--grpc-listen=unix://" + filepath.Join(dir, "decoded.sock"), "--data-listen=127.0.0.1:0"}, common...)
	if o.proxies {
		srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
		c.ctl = c.startProxy(srv, "control", strings.TrimPrefix(c.bootstrap, "tcp://"))
		roomBootstrap = "tcp://" + c.ctl.Listen
		// The data proxy must exist before decoded starts (decoded
		// advertises it); its upstream is set once decoded bound its port.
		c.dat = c.startProxy(srv, "data", "127.0.0.1:9")
		decArgs = append(decArgs, "--data-advertise="+c.dat.Listen)
	}
	c.dec = startDaemon(t, "decoded", decArgs)
	c.data = c.dec.proc().LogField("data listener bound", "addr")
	if c.data == "" {
		t.Fatalf("decoded logged no data address:\n%s", c.dec.proc().Logs())
	}
	c.dec.args = pin(c.dec.args, "--data-listen", c.data)
	if o.proxies {
		if err := c.dat.Update(&toxiproxy.Proxy{Listen: c.dat.Listen, Upstream: c.data, Enabled: true}); err != nil {
			t.Fatal(err)
		}
	}

	c.cfg = sim.Config{
		PrefillGRPC: "unix://" + c.pre.proc().GRPCAddr, DecodeGRPC: "unix://" + c.dec.proc().GRPCAddr,
		Bootstrap: roomBootstrap, Dir: dir, Layout: chaosLayout(),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := sim.New(ctx, c.cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.sim = s
	t.Cleanup(s.Close)

	// Warm up: the control session, the data connections and the gRPC
	// streams exist from here on, so the goroutine baseline counts them.
	rep, err := s.Run(ctx, c.workload(12, 4))
	if err != nil || rep.Outcomes["decode:success"] != 12 || rep.Outcomes["prefill:success"] != 12 {
		t.Fatalf("warm-up: %v %v", err, rep.Outcomes)
	}
	time.Sleep(300 * time.Millisecond)
	c.baseline = map[string]float64{}
	for _, d := range c.daemons() {
		c.baseline[d.name] = c.metric(d, "go_goroutines", nil)
	}
	return c
}

func (c *cluster) startProxy(srv *toxiproxy.ApiServer, name, upstream string) *toxiproxy.Proxy {
	c.t.Helper()
	p := toxiproxy.NewProxy(srv, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(p.Stop)
	return p
}

// chaosLayout is a small model with many pages, so a few hundred small
// requests fit in flight at once: 4 buffers of 2048 pages of 4 KiB.
func chaosLayout() sim.Layout {
	return sim.Layout{Layers: 2, PageTokens: 16, BytesPerToken: 1 << 10, Pages: 2048, AuxRows: 1024, AuxRowLen: 64}
}

// workload is a scenario's base workload: n requests of 1..8 pages,
// at most conc in flight, polled every 20 ms, pages checked.
func (c *cluster) workload(n, conc int) sim.Config {
	return sim.Config{Requests: n, Concurrency: conc, MinTokens: 16, MaxTokens: 128, ChunkPages: 2,
		Tick: 20 * time.Millisecond, PinBound: c.tm.roomBound(), Seed: seed(), CheckPages: true}
}

func (c *cluster) daemons() []*daemon { return []*daemon{c.pre, c.dec} }

// scrape reads a daemon's /metrics.
func (c *cluster) scrape(d *daemon) (map[string]*dto.MetricFamily, error) {
	resp, err := c.client.Get("http://" + d.http + "/metrics")
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
		ok := true
		for k, w := range want {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == w {
					found = true
				}
			}
			ok = ok && found
		}
		if !ok {
			continue
		}
		switch {
		case m.Gauge != nil:
			v += m.GetGauge().GetValue()
		case m.Counter != nil:
			v += m.GetCounter().GetValue()
		case m.Untyped != nil:
			v += m.GetUntyped().GetValue()
		}
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

// rooms reads a daemon's /debug/rooms.
func (c *cluster) rooms(d *daemon) ([]debugRoom, error) {
	resp, err := c.client.Get("http://" + d.http + "/debug/rooms?limit=100000")
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

func live(st string) bool { return st != "Success" && st != "Failed" }

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

// tablesEmpty waits (bounded) for both daemons to hold no room: every
// pdlink_rooms{state} and pdlink_inflight_rooms at 0 and /debug/rooms
// empty. It returns what it found otherwise.
func (c *cluster) tablesEmpty(bound time.Duration) []string {
	var leaks []string
	for _, d := range c.daemons() {
		var last string
		_, ok := eventually(bound, func() bool {
			mfs, err := c.scrape(d)
			if err != nil {
				last = err.Error()
				return false
			}
			held, inflight := sum(mfs, "pdlink_rooms", nil), sum(mfs, "pdlink_inflight_rooms", nil)
			rooms, err := c.rooms(d)
			if err != nil {
				last = err.Error()
				return false
			}
			if held != 0 || inflight != 0 || len(rooms) != 0 {
				ex := ""
				if len(rooms) > 0 {
					ex = fmt.Sprintf(" e.g. room %d %s/%s %s", rooms[0].Room, rooms[0].State, rooms[0].Visible, rooms[0].Reason)
				}
				last = fmt.Sprintf("%s holds %v rooms (%v inflight), /debug/rooms lists %d%s", d.name, held, inflight, len(rooms), ex)
				return false
			}
			return true
		})
		if !ok {
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
		_, ok := eventually(bound, func() bool {
			last = c.metric(d, "go_goroutines", nil)
			return last >= 0 && last <= limit
		})
		if !ok {
			leaks = append(leaks, fmt.Sprintf("%s: %v goroutines, baseline %v", d.name, last, base))
		}
	}
	return leaks
}

// watcher samples both daemons' room metrics while a scenario runs and
// keeps each series' maximum.
type watcher struct {
	c    *cluster
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	max  map[string]float64 // "daemon metric state"
}

func (c *cluster) watch(every time.Duration) *watcher {
	w := &watcher{c: c, stop: make(chan struct{}), done: make(chan struct{}), max: map[string]float64{}}
	go func() {
		defer close(w.done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			for _, d := range c.daemons() {
				mfs, err := c.scrape(d)
				if err != nil {
					continue
				}
				w.mu.Lock()
				for _, name := range []string{"pdlink_rooms_overdue", "pdlink_room_oldest_age_seconds", "pdlink_rooms"} {
					for _, m := range mfs[name].GetMetric() {
						st := ""
						for _, l := range m.GetLabel() {
							if l.GetName() == "state" {
								st = l.GetValue()
							}
						}
						k := d.name + " " + name + " " + st
						w.max[k] = max(w.max[k], m.GetGauge().GetValue())
					}
				}
				k := d.name + " pdlink_inflight_rooms "
				w.max[k] = max(w.max[k], sum(mfs, "pdlink_inflight_rooms", nil))
				w.mu.Unlock()
			}
			select {
			case <-w.stop:
				return
			case <-t.C:
			}
		}
	}()
	return w
}

func (w *watcher) Stop() {
	close(w.stop)
	<-w.done
}

// Max returns the largest value seen of a daemon's metric{state}.
func (w *watcher) Max(d *daemon, metric, state string) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.max[d.name+" "+metric+" "+state]
}

// run runs a workload on the cluster's engines.
func (c *cluster) run(ctx context.Context, w sim.Config) *sim.Report {
	c.t.Helper()
	rep, err := c.sim.Run(ctx, w)
	if err != nil {
		c.t.Fatalf("sim: %v", err)
	}
	return rep
}

// check asserts what every scenario must end with, logs the summary
// line, and adds the scenario to the closing table. allowed, if not nil,
// says which outcomes the scenario may produce.
func (c *cluster) check(name string, rep *sim.Report, allowed func(outcome string) bool) {
	t := c.t
	t.Helper()
	bound := c.cfgBound()
	if rep.Pinned != 0 || rep.WorstTerminal > bound {
		t.Errorf("%d rooms pinned; worst time to terminal %v, bound %v", rep.Pinned, rep.WorstTerminal, bound)
	}
	if rep.Corrupt != 0 || rep.LateWrites != 0 || rep.Crossed != 0 {
		t.Errorf("%d successful rooms with a wrong byte, %d failed rooms written after Failed (R7), %d requests' pages written by another", rep.Corrupt, rep.LateWrites, rep.Crossed)
	}
	if rep.Verified == 0 {
		t.Errorf("no room succeeded and was verified")
	}
	if allowed != nil {
		for k, n := range rep.Outcomes {
			if !allowed(k) {
				t.Errorf("unexpected outcome %s x%d", k, n)
			}
		}
	}
	leaks := c.tablesEmpty(c.tm.linger + 5*time.Second)
	leaks = append(leaks, c.goroutinesBack(15*time.Second)...)
	for _, l := range leaks {
		t.Errorf("leak: %s", l)
	}
	if t.Failed() && len(rep.FaultOutcomes) > 0 {
		t.Logf("outcomes by fault: %v", rep.FaultOutcomes)
	}
	ls := "none"
	if len(leaks) > 0 {
		ls = strings.Join(leaks, "; ")
	}
	out := outcomes(rep)
	t.Logf("%s: %d rooms in %v; %s; worst time to terminal %v (bound %v); verified %d, corrupt %d, late writes %d, crossed %d; leaks: %s",
		name, rep.Requests, rep.Elapsed.Round(time.Millisecond), out, rep.WorstTerminal.Round(time.Millisecond), bound,
		rep.Verified, rep.Corrupt, rep.LateWrites, rep.Crossed, ls)
	addRow(row{Scenario: name, Rooms: rep.Requests, Outcomes: out, Worst: rep.WorstTerminal, Bound: bound, Leaks: ls, Passed: !t.Failed()})
}

func (c *cluster) cfgBound() time.Duration { return c.tm.roomBound() }

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
	for k, v := range b.Faults {
		a.Faults[k] += v
	}
	for k, v := range b.FaultOutcomes {
		a.FaultOutcomes[k] += v
	}
	for k, v := range b.CleanFailed {
		a.CleanFailed[k] += v
	}
	a.Verified += b.Verified
	a.Corrupt += b.Corrupt
	a.LateWrites += b.LateWrites
	a.Crossed += b.Crossed
	a.Pinned += b.Pinned
	a.Bytes += b.Bytes
	a.Elapsed += b.Elapsed
	a.LastChunkToSuccess = append(a.LastChunkToSuccess, b.LastChunkToSuccess...)
	a.WorstTerminal = max(a.WorstTerminal, b.WorstTerminal)
	return a
}

// clients dials both daemons' scheduler APIs for tests that drive rooms
// one call at a time.
func (c *cluster) clients(t *testing.T) (pb.PrefillServiceClient, pb.DecodeServiceClient) {
	t.Helper()
	pc, err := grpc.NewClient(c.cfg.PrefillGRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	dc, err := grpc.NewClient(c.cfg.DecodeGRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dc.Close() })
	return pb.NewPrefillServiceClient(pc), pb.NewDecodeServiceClient(dc)
}
