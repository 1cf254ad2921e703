package daemon

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// --cpu-profile FILE profiles the daemon's whole run and writes the
// profile when it stops (pdctl bench --profile reads it): a gzipped pprof
// profile of CPU samples, there once the daemon returned.
func TestCPUProfileIsWrittenWhenTheDaemonStops(t *testing.T) {
	dir := t.TempDir()
	sock, profile := filepath.Join(dir, "d.sock"), filepath.Join(dir, "prefilld.cpu.pprof")
	cmd := NewCommand(RolePrefill, "test", "a daemon", nil)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"--grpc-listen=unix://" + sock, "--http-listen=127.0.0.1:0",
		"--log-level=error", "--cpu-profile=" + profile})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(ctx) }()
	// The socket is bound after profiling started.
	waitFor(t, func() bool { _, err := os.Stat(sock); return err == nil })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("daemon returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("daemon did not stop")
	}
	f, err := os.Open(profile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("profile is not a gzipped pprof profile: %v", err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	// The profile's string table names its sample types.
	if !bytes.Contains(raw, []byte("cpu")) || !bytes.Contains(raw, []byte("nanoseconds")) {
		t.Errorf("profile of %d bytes names no cpu/nanoseconds sample type", len(raw))
	}
}

// A profile path that cannot be created refuses the start, naming the flag.
func TestUnwritableCPUProfileRefusesTheStartNamingTheFlag(t *testing.T) {
	dir := t.TempDir()
	cmd := NewCommand(RolePrefill, "test", "a daemon", nil)
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	cmd.SetArgs([]string{"--grpc-listen=unix://" + filepath.Join(dir, "d.sock"), "--http-listen=127.0.0.1:0",
		"--log-level=error", "--cpu-profile=" + filepath.Join(dir, "missing", "cpu.pprof")})
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), "--cpu-profile") {
		t.Fatalf("start with an unwritable profile path = %v, want an error naming --cpu-profile", err)
	}
}
