package service

import (
	"testing"

	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/pdlink/pdlink/internal/daemon"
	"github.com/pdlink/pdlink/pkg/room"
)

// TestShmCopyWorkersFlagReachesTheDecodeReceiver: decoded's --shm-copy-workers, parsed
// as the command parses it, is the CopyWorkers of the receiver config its room owner
// builds the data plane with.
func TestShmCopyWorkersFlagReachesTheDecodeReceiver(t *testing.T) {
	cfg := testDaemonConfig(t, daemon.RoleDecode)
	fs := pflag.NewFlagSet("decoded", pflag.ContinueOnError)
	cfg.BindFlags(fs)
	if err := fs.Parse([]string{"--shm-copy-workers=3"}); err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	got := -1
	decodeHook = func(c *room.DecodeConfig) { got = c.Receiver.CopyWorkers }
	t.Cleanup(func() { decodeHook = nil })
	_, stop, done := startDaemon(t, cfg, SetupDecode, zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)))
	stop()
	if err := <-done; err != nil {
		t.Fatalf("decoded run: %v", err)
	}
	if got != 3 {
		t.Fatalf("receiver CopyWorkers %d, want the flag's 3", got)
	}
}
