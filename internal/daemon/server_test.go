package daemon

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"go.uber.org/zap"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testConfig(t *testing.T) Config {
	cfg := DefaultConfig(RoleDecode)
	cfg.GRPCListen = "unix://" + filepath.Join(t.TempDir(), "d.sock")
	cfg.HTTPListen = "127.0.0.1:0"
	cfg.DrainTimeout = time.Second
	return cfg
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// grpcHealth is the daemon's overall gRPC health ("").
func grpcHealth(t *testing.T, s *Server) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	st, err := checkHealth(t, healthClient(t, s), "")
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// Readiness must wait for the slowest component, and a drain must run
// before the components stop.
func TestReadyOnlyWhenEveryComponentServesAndDrainRunsOnStop(t *testing.T) {
	cfg := testConfig(t)
	s, err := NewServer(cfg, zap.NewNop(), "test")
	if err != nil {
		t.Fatal(err)
	}
	release := addSlowComponent(s)
	drained := make(chan struct{})
	s.OnDrain(func(ctx context.Context, deadline time.Time) {
		if capAt, ok := ctx.Deadline(); !ok || !capAt.After(deadline) {
			t.Errorf("drain context's cap %v (set %v) is not past the drain deadline %v", capAt, ok, deadline)
		}
		close(drained)
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	base := "http://" + s.HTTPAddr().String()
	waitFor(t, func() bool { c, _ := get(t, base+"/healthz"); return c == 200 })
	if c, _ := get(t, base+"/readyz"); c != http.StatusServiceUnavailable {
		t.Fatalf("/readyz = %d before the slow component serves", c)
	}
	if st := grpcHealth(t, s); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("grpc health %v before ready", st)
	}
	close(release)
	waitFor(t, func() bool { c, _ := get(t, base+"/readyz"); return c == 200 })
	if st := grpcHealth(t, s); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("grpc health %v when ready", st)
	}
	if c, body := get(t, base+"/metrics"); c != 200 || !strings.Contains(body, "pdlink_build_info") || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("/metrics %d lacks build info or Go collector", c)
	}
	fi, err := os.Stat(s.GRPCAddr().String())
	if err != nil || fi.Mode().Perm() != 0o660 {
		t.Fatalf("unix socket mode %v %v, want 0660", fi.Mode().Perm(), err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v after SIGTERM-like stop", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	select {
	case <-drained:
	default:
		t.Fatal("drain hook not called")
	}
	if _, err := os.Stat(s.GRPCAddr().String()); !os.IsNotExist(err) {
		t.Errorf("unix socket left behind: %v", err)
	}
}

func TestStaleUnixSocketIsReplacedButALiveOneIsRefused(t *testing.T) {
	cfg := testConfig(t)
	s1, err := NewServer(cfg, zap.NewNop(), "test")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewServer(cfg, zap.NewNop(), "test"); err == nil {
		t.Fatal("second daemon bound a socket in use")
	}
	// Close the listeners without removing the socket file: a crash.
	s1.grpcLis.(interface{ SetUnlinkOnClose(bool) }).SetUnlinkOnClose(false)
	s1.grpcLis.Close()
	s1.httpLis.Close()
	s2, err := NewServer(cfg, zap.NewNop(), "test")
	if err != nil {
		t.Fatalf("stale socket not replaced: %v", err)
	}
	s2.grpcLis.Close()
	s2.httpLis.Close()
}

func TestComponentFailureStopsTheDaemonWithItsError(t *testing.T) {
	s, err := NewServer(testConfig(t), zap.NewNop(), "test")
	if err != nil {
		t.Fatal(err)
	}
	s.Add("broken", func(func()) error { return io.ErrUnexpectedEOF }, func(error) {})
	err = s.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("Run = %v, want the broken component's error", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
