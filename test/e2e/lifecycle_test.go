package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/pdlink/pdlink/internal/proc"
)

func startDaemon(t *testing.T, name string, extra ...string) *proc.Process {
	t.Helper()
	return startDaemonUnder(t, nil, name, extra...)
}

// startDaemonUnder is startDaemon with the daemon run by wrap (a command
// that ends by exec'ing its trailing argv, so the process is the daemon's);
// nil runs it plainly.
func startDaemonUnder(t *testing.T, wrap []string, name string, extra ...string) *proc.Process {
	t.Helper()
	args := append([]string{
		"--grpc-listen=unix://" + filepath.Join(t.TempDir(), name+".sock"),
		"--http-listen=127.0.0.1:0",
		"--region-dir=" + regionRoot,
	}, extra...)
	cmd := bin(name)
	if len(wrap) > 0 {
		cmd, args = wrap[0], append(append(wrap[1:len(wrap):len(wrap)], bin(name)), args...)
	}
	p, err := proc.Start(context.Background(), cmd, args, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		select {
		case <-p.Exited():
		default:
			_ = p.Kill()
		}
	})
	return p
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestBothDaemonsServeHealthAndStopCleanlyOnSIGTERM(t *testing.T) {
	for _, d := range []struct{ name, extra string }{
		{"prefilld", "--bootstrap-listen=tcp://127.0.0.1:0"},
		{"decoded", "--data-listen=127.0.0.1:0"},
	} {
		t.Run(d.name, func(t *testing.T) {
			p := startDaemon(t, d.name, d.extra)
			for _, path := range []string{"/healthz", "/readyz"} {
				if code, body := httpGet(t, "http://"+p.HTTPAddr+path); code != 200 {
					t.Errorf("%s = %d %q", path, code, body)
				}
			}
			if _, body := httpGet(t, "http://"+p.HTTPAddr+"/metrics"); !strings.Contains(body, "pdlink_build_info{side=") {
				t.Errorf("/metrics lacks pdlink_build_info")
			}
			conn, err := grpc.NewClient("unix://"+p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
			cancel()
			conn.Close()
			if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("grpc health %v %v", resp, err)
			}
			if err := p.Stop(15 * time.Second); err != nil {
				t.Fatalf("exit after SIGTERM: %v\n%s", err, p.Logs())
			}
			if !strings.Contains(p.Logs(), `"msg":"draining"`) {
				t.Errorf("no drain logged:\n%s", p.Logs())
			}
		})
	}
}

func TestVersionFlag(t *testing.T) {
	for _, name := range []string{"prefilld", "decoded", "pdctl"} {
		out, err := exec.Command(bin(name), "--version").CombinedOutput()
		if err != nil || !strings.HasPrefix(string(out), name+" ") {
			t.Errorf("%s --version = %q %v", name, out, err)
		}
	}
}

func TestBadFlagIsRefusedAtStartWithOneLine(t *testing.T) {
	out, err := exec.Command(bin("decoded"), "--heartbeat-misses=0").CombinedOutput()
	if err == nil {
		t.Fatal("decoded started with --heartbeat-misses=0")
	}
	msg := strings.TrimSpace(string(out))
	if strings.Contains(msg, "\n") || !strings.Contains(msg, "--heartbeat-misses") {
		t.Fatalf("want one line naming the flag, got %q", msg)
	}
}

func TestEnvironmentConfiguresTheDaemon(t *testing.T) {
	cmd := exec.Command(bin("prefilld"))
	cmd.Env = append(cmd.Environ(), "PDLINK_LOG_FORMAT=yaml")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "PDLINK_LOG_FORMAT") && !strings.Contains(string(out), "--log-format") {
		t.Fatalf("PDLINK_LOG_FORMAT=yaml not refused: %q %v", out, err)
	}
}

func TestPdctlDemoMovesVerifiedBytesAndNothingPins(t *testing.T) {
	for _, faults := range []bool{false, true} {
		t.Run(fmt.Sprintf("faults=%v", faults), func(t *testing.T) {
			args := []string{"demo", "--bin-dir", binDir, "--requests", "40", "--layers", "2", "--pages", "256",
				"--max-tokens", "1024", "--shm-dir", t.TempDir()}
			if faults {
				args = append(args, "--faults")
			}
			out, err := exec.Command(bin("pdctl"), args...).CombinedOutput()
			if err != nil {
				t.Fatalf("pdctl demo: %v\n%s", err, out)
			}
			s := string(out)
			wants := []string{"pinned:       0", " 0 corrupt, 0 with writes after Failed", "decode:success", "prefill:success", "inflight now 0"}
			if faults {
				wants = append(wants, "peer restart: decoded killed -9 after", "faults injected:")
			}
			for _, want := range wants {
				if !strings.Contains(s, want) {
					t.Errorf("demo output lacks %q:\n%s", want, s)
				}
			}
		})
	}
}
