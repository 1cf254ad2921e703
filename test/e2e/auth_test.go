package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pdlink/pdlink/internal/proc"
	"github.com/pdlink/pdlink/internal/sim"
	"github.com/pdlink/pdlink/internal/testbed"
)

func tokenFile(t *testing.T, token string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNonLoopbackListenWithoutATokenRefusesToStart(t *testing.T) {
	out, err := exec.Command(bin("prefilld"), "--bootstrap-listen=tcp://0.0.0.0:8998", "--grpc-listen=unix://"+filepath.Join(t.TempDir(), "p.sock")).CombinedOutput()
	if err == nil {
		t.Fatal("prefilld started on 0.0.0.0 without a token")
	}
	msg := strings.TrimSpace(string(out))
	for _, want := range []string{"--bootstrap-listen", "--auth-token-file", "--insecure"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %s", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("message is not one line: %q", msg)
	}
}

// Both daemons share a token: rooms succeed and nothing is refused. A
// decoded with another token gets nowhere: its frames are refused and
// counted (mac_invalid), and its rooms end at their deadline, not never.
func TestSharedTokenWorksAndAWrongTokenIsRefusedAndCounted(t *testing.T) {
	good := tokenFile(t, strings.Repeat("a", 40))
	pre, dec, cfg := pairProcs(t, "--auth-token-file="+good, "--bootstrap-timeout=2s", "--waiting-timeout=2s")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg.Requests, cfg.Concurrency = 20, 4
	rep, err := sim.Run(ctx, cfg)
	if err != nil || rep.Outcomes["decode:success"] != 20 || rep.Corrupt != 0 {
		t.Fatalf("with a shared token: %+v %v", rep, err)
	}
	for _, p := range []string{pre.HTTPAddr, dec.HTTPAddr} {
		if n := metric(t, p, "pdlink_auth_rejected_total"); n != 0 {
			t.Errorf("%s refused %v frames or connections with a shared token", p, n)
		}
	}

	// A second prefilld with the same token and a decoded with another one.
	pre2 := startDaemon(t, "prefilld", "--bootstrap-listen=tcp://127.0.0.1:0", "--auth-token-file="+good,
		"--bootstrap-timeout=2s", "--waiting-timeout=2s")
	wrong := startDaemon(t, "decoded", "--data-listen=127.0.0.1:0", "--auth-token-file="+tokenFile(t, strings.Repeat("b", 40)),
		"--bootstrap-timeout=2s", "--waiting-timeout=2s")
	pre = pre2
	cfg.PrefillGRPC, cfg.DecodeGRPC = "unix://"+pre2.GRPCAddr, "unix://"+wrong.GRPCAddr
	cfg.Bootstrap = pre2.LogField("bootstrap socket bound", "addr")
	cfg.Requests, cfg.Concurrency = 3, 3
	cfg.PinBound = 15 * time.Second
	rep, err = sim.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Outcomes["decode:success"] != 0 || rep.Pinned != 0 {
		t.Fatalf("with a wrong token: %v (pinned %d)", rep.Outcomes, rep.Pinned)
	}
	if n := metric(t, pre.HTTPAddr, `pdlink_auth_rejected_total{reason="mac_invalid"`); n == 0 {
		t.Errorf("prefilld did not count the wrong token's frames")
	}
	if n := metric(t, pre.HTTPAddr, `pdlink_frames_rejected_total{reason="auth"`); n == 0 {
		t.Errorf("frames_rejected_total{reason=auth} stayed 0")
	}
}

// Token rotation under load: both daemons move to a new token (file
// rewritten, SIGHUP one after the other) while rooms flow; none fails. A
// token file that went bad on SIGHUP keeps the daemon running on the
// tokens in force and counts a reload error.
func TestTokenRotationUnderLoadKeepsRoomsSucceeding(t *testing.T) {
	const promoteDelay, afterPromotion = time.Second, 20
	file := tokenFile(t, strings.Repeat("o", 40))
	pre, dec, cfg := pairProcs(t, "--auth-token-file="+file, "--auth-token-promote-delay="+promoteDelay.String(), "--auth-token-overlap=10s")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg.Concurrency, cfg.Tick = 2, 2*time.Millisecond
	engines, err := sim.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer engines.Close()
	// The rooms run until both daemons sign with the new token and rooms
	// ran on it: a fixed number of rooms could all end before the reloads
	// or the promotions on a fast machine, and prove nothing.
	bg := testbed.StartBackground(ctx, t, engines, cfg, 20)
	select {
	case <-bg.Warm: // rooms ended on the old token
	case <-ctx.Done():
		t.Fatal("no room ended on the old token")
	}
	if err := os.WriteFile(file, []byte(strings.Repeat("n", 40)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reloadsOK := func(p *proc.Process) float64 {
		return metric(t, p.HTTPAddr, `pdlink_auth_token_reloads_total{result="ok"`)
	}
	// A rolling reload, not an atomic one: decoded reloads once prefilld did.
	for _, p := range []*proc.Process{pre, dec} {
		if err := p.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		if _, ok := testbed.Eventually(10*time.Second, func() bool { return reloadsOK(p) == 1 }); !ok {
			t.Fatalf("%s counted no reload 10s after its SIGHUP", p.Name)
		}
	}
	// Each daemon promotes the new token promoteDelay after its reload,
	// which was counted by now; then rooms run on the new token alone.
	promoted := time.Now().Add(promoteDelay)
	ended := -1
	if _, ok := testbed.Eventually(30*time.Second, func() bool {
		if time.Now().Before(promoted) {
			return false
		}
		if ended < 0 {
			ended = bg.Ended()
		}
		return bg.Ended() >= ended+afterPromotion
	}); !ok {
		t.Fatalf("fewer than %d rooms ended after the promotions", afterPromotion)
	}
	rep := bg.Report()
	if rep == nil {
		t.Fatal("no report")
	}
	if rep.Outcomes["decode:success"] != rep.Requests || rep.Outcomes["prefill:success"] != rep.Requests || rep.Corrupt != 0 {
		t.Fatalf("rooms failed during the rotation: %d rooms, %v", rep.Requests, rep.Outcomes)
	}
	for _, p := range []*proc.Process{pre, dec} {
		if n := reloadsOK(p); n != 1 {
			t.Errorf("%s reloads ok = %v, want 1", p.Name, n)
		}
	}
	// A broken file on the next SIGHUP: counted, and the daemon serves on.
	if err := os.WriteFile(file, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := pre.Cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for metric(t, pre.HTTPAddr, `pdlink_auth_token_reloads_total{result="error"`) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("reload error not counted")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cfg.Requests = 5
	if rep, err := engines.Run(ctx, cfg); err != nil || rep.Outcomes["decode:success"] != 5 {
		t.Fatalf("after a bad reload: %v %v", rep, err)
	}
}
