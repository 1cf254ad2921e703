package daemon

import (
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func hangup(t *testing.T) {
	t.Helper()
	if err := syscall.Kill(syscall.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
}

func stillRunning(t *testing.T, s *Server, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("Run returned %v after SIGHUP", err)
	default:
	}
	if c, _ := get(t, "http://"+s.HTTPAddr().String()+"/readyz"); c != 200 {
		t.Fatalf("/readyz = %d after SIGHUP", c)
	}
}

// `systemctl reload` of a daemon without --auth-token-file sends SIGHUP to
// a process with nothing to reload. Untaken, it killed the daemon and systemd
// called that a clean exit: the unit stayed dead. (If SIGHUP is not taken,
// this test's own process dies of it.)
func TestSIGHUPWithNothingToReloadKeepsServing(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	s, err := NewServer(testConfig(t), zap.New(core), "test")
	if err != nil {
		t.Fatal(err)
	}
	done := runServer(t, s)
	for n := 1; n <= 2; n++ {
		hangup(t)
		waitFor(t, func() bool { return logs.FilterMessage("reload: nothing to reload").Len() == n })
		stillRunning(t, s, done)
	}
}

// With something registered, each SIGHUP runs every reload once, in the
// order registered, and the daemon serves on.
func TestSIGHUPRunsEveryReloadInOrderAndKeepsServing(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	s, err := NewServer(testConfig(t), zap.New(core), "test")
	if err != nil {
		t.Fatal(err)
	}
	ran := make(chan string, 4)
	s.OnReload("first", func() { ran <- "first" })
	s.OnReload("second", func() { ran <- "second" })
	done := runServer(t, s)
	for n := 1; n <= 2; n++ {
		hangup(t)
		for _, want := range []string{"first", "second"} {
			select {
			case got := <-ran:
				if got != want {
					t.Fatalf("SIGHUP %d: reload %q ran, want %q", n, got, want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("SIGHUP %d: reload %q did not run", n, want)
			}
		}
		stillRunning(t, s, done)
	}
	select {
	case extra := <-ran:
		t.Fatalf("reload %q ran more than once per SIGHUP", extra)
	default:
	}
	if n := logs.FilterMessage("reload: nothing to reload").Len(); n != 0 {
		t.Errorf("logged nothing to reload %d times with two reloads registered", n)
	}
}
