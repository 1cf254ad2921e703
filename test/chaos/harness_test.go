package chaos

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"

	"github.com/pdlink/pdlink/internal/sim"
	"github.com/pdlink/pdlink/internal/testbed"
)

// startDaemon runs bin(name) with args on loopback; the daemon is killed
// when the test ends (see testbed.Start).
func startDaemon(t *testing.T, name string, args []string, client *http.Client) *testbed.Daemon {
	t.Helper()
	return testbed.Start(t, name, bin(name), args, testbed.Options{Client: client, LogDir: os.Getenv("PDLINK_CHAOS_LOGDIR")})
}

// cluster is a prefilld and a decoded on loopback, optionally with a
// Toxiproxy proxy on the control link (decode -> prefill bootstrap) and
// one on the data link (prefill -> decode data), and the simulated
// engines registered with both.
type cluster struct {
	t         *testing.T
	tm        testbed.Timings
	pre, dec  *testbed.Daemon
	bootstrap string // prefilld's bound address, tcp://host:port
	data      string // decoded's bound data address
	ctl, dat  *toxiproxy.Proxy
	sim       *sim.Sim
	cfg       sim.Config
	baseline  map[string]float64 // go_goroutines after the warm-up
	client    *http.Client
}

type clusterOpts struct {
	tm      testbed.Timings
	proxies bool
}

func newCluster(t *testing.T, o clusterOpts) *cluster {
	t.Helper()
	if o.tm == (testbed.Timings{}) {
		o.tm = testbed.ShortTimings()
	}
	dir := t.TempDir()
	c := &cluster{t: t, tm: o.tm, client: &http.Client{Timeout: 5 * time.Second}}
	t.Cleanup(c.client.CloseIdleConnections)

	// The engines' regions, and the only directory the daemons map them from.
	regions := filepath.Join(dir, "regions")
	if err := os.Mkdir(regions, 0o755); err != nil {
		t.Fatal(err)
	}
	common := append([]string{"--http-listen=127.0.0.1:0", "--region-dir=" + regions, "--data-transport=" + chaosTransport()}, o.tm.Args()...)
	c.pre = startDaemon(t, "prefilld", append([]string{"--grpc-listen=unix://" + filepath.Join(dir, "prefilld.sock"),
		"--bootstrap-listen=tcp://127.0.0.1:0"}, common...), c.client)
	c.bootstrap = c.pre.Proc().LogField("bootstrap socket bound", "addr")
	if c.bootstrap == "" {
		t.Fatalf("prefilld logged no bootstrap address:\n%s", c.pre.Proc().Logs())
	}
	c.pre.Pin("--bootstrap-listen", c.bootstrap)
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
	c.dec = startDaemon(t, "decoded", decArgs, c.client)
	c.data = c.dec.Proc().LogField("data listener bound", "addr")
	if c.data == "" {
		t.Fatalf("decoded logged no data address:\n%s", c.dec.Proc().Logs())
	}
	c.dec.Pin("--data-listen", c.data)
	if o.proxies {
		if err := c.dat.Update(&toxiproxy.Proxy{Listen: c.dat.Listen, Upstream: c.data, Enabled: true}); err != nil {
			t.Fatal(err)
		}
	}

	c.cfg = sim.Config{
		PrefillGRPC: "unix://" + c.pre.Proc().GRPCAddr, DecodeGRPC: "unix://" + c.dec.Proc().GRPCAddr,
		Bootstrap: roomBootstrap, Dir: regions, Layout: testbed.Layout(),
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
	c.baseline = testbed.Baseline(c.daemons())
	// The matrix is only one if the pages went the way it says: on shm (and auto, one
	// host) decoded copied the warm-up's pages from prefill's mapping; on tcp it never did.
	copied := c.dec.Metric("pdlink_shm_copied_bytes_total", nil)
	if shm := chaosTransport() != "tcp"; shm != (copied > 0) {
		t.Fatalf("--data-transport=%s: decoded copied %v bytes from prefill mappings in the warm-up", chaosTransport(), copied)
	}
	return c
}

// chaosTransport is the --data-transport both daemons run (PDLINK_CHAOS_TRANSPORT, auto
// by default: same-host pages, as the daemons share the host); make test runs the suite
// on auto and on tcp, so every scenario runs on both data paths.
func chaosTransport() string {
	if k := os.Getenv("PDLINK_CHAOS_TRANSPORT"); k != "" {
		return k
	}
	return "auto"
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

// workload is a scenario's base workload: n requests of 1..8 pages,
// at most conc in flight, polled every 20 ms, pages checked.
func (c *cluster) workload(n, conc int) sim.Config {
	return testbed.Workload(n, conc, c.tm.RoomBound(), seed())
}

func (c *cluster) daemons() []*testbed.Daemon { return []*testbed.Daemon{c.pre, c.dec} }

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
				mfs, err := d.Scrape()
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
						k := d.Name + " " + name + " " + st
						w.max[k] = max(w.max[k], m.GetGauge().GetValue())
					}
				}
				k := d.Name + " pdlink_inflight_rooms "
				w.max[k] = max(w.max[k], testbed.Sum(mfs, "pdlink_inflight_rooms", nil))
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
func (w *watcher) Max(d *testbed.Daemon, metric, state string) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.max[d.Name+" "+metric+" "+state]
}

// run runs a workload on the cluster's engines.
func (c *cluster) run(ctx context.Context, w sim.Config) *sim.Report {
	c.t.Helper()
	return testbed.Run(ctx, c.t, c.sim, w)
}

// check asserts what every scenario must end with (testbed.CheckReport
// and testbed.Leaks), logs the summary line, and adds the scenario to the
// closing table. allowed, if not nil, says which outcomes the scenario
// may produce.
func (c *cluster) check(name string, rep *sim.Report, allowed func(outcome string) bool) {
	t := c.t
	t.Helper()
	bound := c.tm.RoomBound()
	testbed.CheckReport(t, rep, bound, allowed)
	leaks := testbed.Leaks(c.daemons(), c.tm, c.baseline, true)
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
	t.Logf("%s: %s; leaks: %s", name, testbed.Summary(rep, bound), ls)
	addRow(row{Scenario: name, Rooms: rep.Requests, Outcomes: testbed.Outcomes(rep), Worst: rep.WorstTerminal, Bound: bound, Leaks: ls, Passed: !t.Failed()})
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
