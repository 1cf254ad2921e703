package daemon

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
)

// Under systemd (Type=notify, WatchdogSec) the daemon says READY=1 once
// every component serves, WATCHDOG=1 at half the asked interval while
// ready, and STOPPING=1 when the drain starts.
func TestSystemdNotifyReadyWatchdogStopping(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)
	t.Setenv("WATCHDOG_USEC", "100000") // 100ms: pings every 50ms
	t.Setenv("WATCHDOG_PID", "")

	s, err := NewServer(testConfig(t), zap.NewNop(), "test")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()

	read := func() string {
		buf := make([]byte, 256)
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("no notification: %v", err)
		}
		return string(buf[:n])
	}
	if got := read(); got != "READY=1" {
		t.Fatalf("first notification %q, want READY=1", got)
	}
	if got := read(); got != "WATCHDOG=1" {
		t.Fatalf("second notification %q, want WATCHDOG=1", got)
	}
	cancel()
	for {
		got := read()
		if got == "STOPPING=1" {
			break
		}
		if !strings.HasPrefix(got, "WATCHDOG=") {
			t.Fatalf("unexpected notification %q", got)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
