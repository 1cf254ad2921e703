package twohost

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pdlink/pdlink/internal/sim"
	"github.com/pdlink/pdlink/internal/testbed"
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

// shortTimings are testbed's short deadlines, with a linger well past
// every fault bound, so a failed room is not reaped before its scheduler
// could see Failed.
func shortTimings() testbed.Timings {
	tm := testbed.ShortTimings()
	tm.Linger = 8 * time.Second
	return tm
}

// startDaemon runs bin(name) inside h with args (see testbed.Start); its
// /metrics and /debug/rooms are read from inside h.
func startDaemon(t *testing.T, h *host, name string, args ...string) *testbed.Daemon {
	t.Helper()
	cmd, argv := h.command(bin(name), args...)
	return testbed.Start(t, name, cmd, argv, testbed.Options{Client: h.client, LogDir: os.Getenv("PDLINK_TWOHOST_LOGDIR")})
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
	tm         testbed.Timings
	pre, dec   *testbed.Daemon
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

// daemonArgs are each daemon's arguments with the shared token file, and
// the unix socket its engine uses and its region directory under dir.
func daemonArgs(tm testbed.Timings, dir, token string) (pre, dec []string) {
	pre = append([]string{"--grpc-listen=unix://" + filepath.Join(dir, "prefilld.sock"), "--http-listen=" + prefillHTTP,
		"--bootstrap-listen=" + bootstrapAddr, "--region-dir=" + dir}, tm.Args()...)
	dec = append([]string{"--grpc-listen=unix://" + filepath.Join(dir, "decoded.sock"), "--http-listen=" + decodeHTTP,
		"--data-listen=" + dataListen, "--data-advertise=" + dataAdvertise, "--region-dir=" + dir}, tm.Args()...)
	// Two hosts share no memory; these two share a filesystem, on which auto would
	// take the same-host path. Pages go over the veth, as between two machines.
	pre, dec = append(pre, "--data-transport=tcp"), append(dec, "--data-transport=tcp")
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
	c := &cluster{t: t, tm: shortTimings(), preH: preH, decH: decH}
	if o.smallSocketBuffers {
		preH.sysctl(t, "net.ipv4.tcp_wmem", "4096 8192 16384")
		decH.sysctl(t, "net.ipv4.tcp_rmem", "4096 8192 16384")
	}
	dir := t.TempDir()
	preArgs, decArgs := daemonArgs(c.tm, dir, tokenFile(t))
	c.pre = startDaemon(t, preH, "prefilld", preArgs...)
	c.dec = startDaemon(t, decH, "decoded", decArgs...)
	if got := c.pre.Proc().LogField("bootstrap socket bound", "addr"); got != bootstrapAddr {
		t.Fatalf("prefilld bound its bootstrap socket on %q, want %q", got, bootstrapAddr)
	}
	if o.prometheus {
		c.prom = startPrometheus(t, preH, map[string]string{"pdlink-prefill": prefillHTTP, "pdlink-decode": decodeHTTP})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := sim.New(ctx, sim.Config{
		PrefillGRPC: "unix://" + c.pre.Proc().GRPCAddr, DecodeGRPC: "unix://" + c.dec.Proc().GRPCAddr,
		Bootstrap: bootstrapAddr, Dir: dir, Layout: testbed.Layout(),
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
	c.baseline = testbed.Baseline(c.daemons())
	return c
}

// workload is n requests, at most conc in flight (testbed.Workload).
func (c *cluster) workload(n, conc int) sim.Config {
	return testbed.Workload(n, conc, c.tm.RoomBound(), uint64(time.Now().UnixNano()))
}

func (c *cluster) daemons() []*testbed.Daemon { return []*testbed.Daemon{c.pre, c.dec} }

func (c *cluster) run(ctx context.Context, w sim.Config) *sim.Report {
	c.t.Helper()
	return testbed.Run(ctx, c.t, c.sim, w)
}

// liveRooms returns the rooms d holds that its scheduler does not see
// terminal yet, with their state.
func (c *cluster) liveRooms(d *testbed.Daemon) map[uint64]string {
	c.t.Helper()
	rs, err := d.Rooms()
	if err != nil {
		c.t.Fatalf("%s /debug/rooms: %v", d.Name, err)
	}
	out := map[uint64]string{}
	for _, r := range rs {
		if testbed.Live(r.Visible) {
			out[r.Room] = r.Visible
		}
	}
	return out
}

// check asserts what every scenario must end with: no room pinned, every
// room terminal within the bound, every Success verified byte for byte,
// no write after Failed, only allowed outcomes, empty tables and no
// goroutine leak once the schedulers cleared.
func (c *cluster) check(rep *sim.Report, allowed func(outcome string) bool) {
	t := c.t
	t.Helper()
	bound := c.tm.RoomBound()
	testbed.CheckReport(t, rep, bound, allowed)
	for _, l := range testbed.Leaks(c.daemons(), c.tm, c.baseline, false) {
		t.Errorf("leak: %s", l)
	}
	t.Logf("%s", testbed.Summary(rep, bound))
}
