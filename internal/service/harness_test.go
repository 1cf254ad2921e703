package service

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/daemon"
	"github.com/pdlink/pdlink/pkg/transfer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair is a prefilld and a decoded running in this process on loopback.
type pair struct {
	pre, dec  *daemon.Server
	preCfg    daemon.Config
	bootstrap string
	prefill   pb.PrefillServiceClient
	decode    pb.DecodeServiceClient
	preAdmin  pb.AdminServiceClient
	decAdmin  pb.AdminServiceClient
	preHTTP   string
	decHTTP   string
	stopPre   context.CancelFunc
	stopDec   context.CancelFunc
	preDone   chan error
	decDone   chan error
}

// The harness's timings. Heartbeats stay frequent, so what rides on them is as prompt as
// before, but a peer counts as lost only after harnessPeerSilence: on this 2-core machine
// at load 10-15 a daemon's goroutines go unscheduled for a second and more (a 600 ms bound
// lost peers in tests that were only starved), and no test here checks how soon a lost
// peer is seen (pkg/conn and test/e2e do, on their own timings). Rooms time out after
// harnessRoomTimeout; a wait for an outcome lasts waitBound, long enough for a room to
// time out and for its Failed to cross to the other side on a starved machine.
const (
	harnessHeartbeat   = 200 * time.Millisecond
	harnessPeerSilence = 5 * time.Second
	harnessRoomTimeout = 5 * time.Second
	waitBound          = 3 * harnessRoomTimeout
)

func testDaemonConfig(t testing.TB, role daemon.Role) daemon.Config {
	cfg := daemon.DefaultConfig(role)
	cfg.GRPCListen = "unix://" + filepath.Join(t.TempDir(), string(role)+".sock")
	cfg.HTTPListen = "127.0.0.1:0"
	cfg.BootstrapTimeout = harnessRoomTimeout
	cfg.WaitingTimeout = harnessRoomTimeout
	cfg.TransferIdleTimeout = harnessRoomTimeout
	cfg.HeartbeatInterval = harnessHeartbeat
	cfg.HeartbeatMisses = int(harnessPeerSilence / harnessHeartbeat)
	cfg.DrainTimeout = 3 * time.Second
	// newRegion and the tests' own regions are made under t.TempDir().
	cfg.RegionDirs = []string{filepath.Clean(os.TempDir())}
	switch role {
	case daemon.RolePrefill:
		cfg.BootstrapListen = "tcp://127.0.0.1:0"
	case daemon.RoleDecode:
		cfg.DataListen = "127.0.0.1:0"
	}
	return cfg
}

func startDaemon(t testing.TB, cfg daemon.Config, setup daemon.Setup, log *zap.Logger) (*daemon.Server, context.CancelFunc, chan error) {
	t.Helper()
	s, err := daemon.NewServer(cfg, log, "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := setup(s, cfg, log); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for !s.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("daemon not ready within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return s, cancel, done
}

func client(t testing.TB, s *daemon.Server) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient("unix://"+s.GRPCAddr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// startPair starts both daemons; the prefill's bootstrap address comes
// from its node, read back through the test hook below.
func startPair(t *testing.T) *pair { return startPairWith(t, nil) }

func startPairWith(t testing.TB, tweak func(pre, dec *daemon.Config)) *pair {
	t.Helper()
	return startPairLoggingTo(t, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)), tweak)
}

// startPairLoggingTo is startPairWith with the daemons logging to log.
func startPairLoggingTo(t testing.TB, log *zap.Logger, tweak func(pre, dec *daemon.Config)) *pair {
	t.Helper()
	p := &pair{preCfg: testDaemonConfig(t, daemon.RolePrefill)}
	decCfg := testDaemonConfig(t, daemon.RoleDecode)
	if tweak != nil {
		tweak(&p.preCfg, &decCfg)
	}
	var boot string
	bootstrapHook = func(addr string) { boot = addr }
	t.Cleanup(func() { bootstrapHook = nil })
	p.pre, p.stopPre, p.preDone = startDaemon(t, p.preCfg, SetupPrefill, log.Named("prefilld"))
	p.bootstrap = boot
	if p.bootstrap == "" {
		t.Fatal("bootstrap address not reported")
	}
	p.dec, p.stopDec, p.decDone = startDaemon(t, decCfg, SetupDecode, log.Named("decoded"))
	pc, dc := client(t, p.pre), client(t, p.dec)
	p.prefill, p.decode = pb.NewPrefillServiceClient(pc), pb.NewDecodeServiceClient(dc)
	p.preAdmin, p.decAdmin = pb.NewAdminServiceClient(pc), pb.NewAdminServiceClient(dc)
	p.preHTTP, p.decHTTP = "http://"+p.pre.HTTPAddr().String(), "http://"+p.dec.HTTPAddr().String()
	t.Cleanup(func() { p.stop(t) })
	trackPair(t, p)
	return p
}

func (p *pair) stop(t testing.TB) {
	for _, s := range []struct {
		cancel context.CancelFunc
		done   chan error
	}{{p.stopDec, p.decDone}, {p.stopPre, p.preDone}} {
		if s.cancel == nil {
			continue
		}
		s.cancel()
		select {
		case err := <-s.done:
			if err != nil {
				dumpOnTimeout(t, "daemon stop")
				t.Errorf("daemon stopped with %v", err)
			}
		case <-time.After(20 * time.Second):
			dumpOnTimeout(t, "daemon stop")
			t.Error("daemon did not stop within 20s")
		}
	}
	p.stopDec, p.stopPre = nil, nil
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// metric returns the value of the first sample line starting with prefix.
func metric(t *testing.T, base, prefix string) string {
	t.Helper()
	for _, line := range strings.Split(httpGet(t, base+"/metrics"), "\n") {
		if strings.HasPrefix(line, prefix) {
			return line[strings.LastIndexByte(line, ' ')+1:]
		}
	}
	t.Fatalf("no sample %s", prefix)
	return ""
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// eventually polls cond until it holds, failing the test after waitBound with a dump
// (dumpOnTimeout) that tells a hang from a starved machine.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for !cond() {
		if time.Now().After(deadline) {
			dumpOnTimeout(t, what)
			t.Fatalf("%s: not within %v", what, waitBound)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// subscribed fails t unless the Watch call (its stream and error) opened a
// stream the daemon has subscribed: the header comes after the
// subscription, so no transition after it is missed.
func subscribed(t testing.TB, stream grpc.ClientStream, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Header(); err != nil {
		t.Fatal(err)
	}
}

// waitBothSuccess waits until each room is Success on both sides. A side that is Failed
// fails t at once with its reasons (failedInsteadOfSuccess), not after waitBound.
func waitBothSuccess(t *testing.T, p *pair, rooms ...uint64) {
	t.Helper()
	for _, r := range rooms {
		what := fmt.Sprintf("room %d Success on both sides", r)
		eventually(t, what, func() bool {
			ps, ds := pollState(t, p, r)
			failedInsteadOfSuccess(t, what, ps, ds)
			return ps.State == pb.RoomState_ROOM_STATE_SUCCESS && ds.State == pb.RoomState_ROOM_STATE_SUCCESS
		})
	}
}

// failedInsteadOfSuccess fails t at once, naming each side's state and reasons, when a
// side of a room awaited for Success is Failed: Failed is terminal (I1), so the wait could
// only run out and hide why.
func failedInsteadOfSuccess(t *testing.T, what string, pre, dec *pb.RoomStatus) {
	t.Helper()
	if pre.State != pb.RoomState_ROOM_STATE_FAILED && dec.State != pb.RoomState_ROOM_STATE_FAILED {
		return
	}
	t.Fatalf("%s: room Failed instead: prefill %s; decode %s", what, statusLine(pre), statusLine(dec))
}

// statusLine is a side's state and reasons for a failure message.
func statusLine(s *pb.RoomStatus) string {
	return fmt.Sprintf("%v reason %q peer_reason %q", s.State, s.Reason, s.PeerReason)
}

// dataTransports are the data planes a byte check through the daemons runs over: tcp,
// where prefill gathers head slices and decode scatters them itself, the checksum
// covering what was gathered and what was scattered (so only the bytes landed show a
// wrong offset), and shm, where decode copies from the prefill mapping (a stream it
// cannot map fails rather than falling back to tcp as auto would, the default that
// took the same-host path alone on one host).
var dataTransports = []transfer.Kind{transfer.KindTCP, transfer.KindShm}

// onTransport is a config tweak setting both daemons' --data-transport to kind.
func onTransport(kind transfer.Kind) func(pre, dec *daemon.Config) {
	return func(pre, dec *daemon.Config) { pre.DataTransport, dec.DataTransport = kind, kind }
}

// inParallel calls call(i) for every i in [0, n) from workers goroutines, as
// an engine's schedulers call the daemon, and fails tb on the first error.
func inParallel(tb testing.TB, workers, n int, call func(i int) error) {
	tb.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += workers {
				if err := call(i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
}
