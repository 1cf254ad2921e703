package zmtp

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// crashChildEnv makes the test binary act as a crash child (see TestMain).
const crashChildEnv = "ZMTP_CRASH_CHILD"

const childSurvived = "zmtp-crash-child: survived"

// crashInputs are the two inputs that kill an unguarded zmq4 v0.17.0
// ROUTER, with the panic each one causes.
var crashInputs = map[string]struct {
	input []byte
	panic string
}{
	"huge_frame": {crashHugeFrame, "makeslice: len out of range"},
	"cut_ready":  {crashCutReady, "slice bounds out of range"},
	// Found by FuzzGuard: not in the original brief.
	"no_socket_type": {crashNoSocketType, `unknown socket-type: ""`},
}

// runCrashChild binds a plain (unguarded) zmq4 ROUTER on loopback, sends
// it one crash input over raw TCP and waits. If zmq4 does not panic the
// child prints childSurvived and exits 0.
func runCrashChild(mode string) {
	in, ok := crashInputs[mode]
	if !ok {
		fmt.Fprintln(os.Stderr, "unknown crash mode", mode)
		os.Exit(3)
	}
	router := zmq4.NewRouter(context.Background(), zmq4.WithLogger(discard))
	if err := router.Listen("tcp://127.0.0.1:0"); err != nil {
		fmt.Fprintln(os.Stderr, "listen:", err)
		os.Exit(3)
	}
	c, err := net.Dial("tcp", router.Addr().String())
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		os.Exit(3)
	}
	go func() { _, _ = c.Read(make([]byte, 1<<16)) }()
	if _, err := c.Write(in.input); err != nil {
		fmt.Fprintln(os.Stderr, "write:", err)
		os.Exit(3)
	}
	time.Sleep(3 * time.Second)
	fmt.Println(childSurvived)
	os.Exit(0)
}

// TestUnguardedZMQ4RouterPanics documents the library bug the guard exists
// for: each crash input, sent by any TCP peer, kills a process that runs a
// plain zmq4 ROUTER, from a library goroutine no recover() can reach. If
// this test fails because the child survived, zmq4 was fixed.
func TestUnguardedZMQ4RouterPanics(t *testing.T) {
	if testing.Short() {
		t.Skip("re-execs the test binary")
	}
	for mode, in := range crashInputs {
		t.Run(mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), crashChildEnv+"="+mode)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if strings.Contains(stdout.String(), childSurvived) {
				t.Fatalf("unguarded zmq4 survived %s: library fixed? stderr:\n%s", mode, stderr.String())
			}
			if err == nil {
				t.Fatalf("child exited 0 without surviving; stdout:\n%s", stdout.String())
			}
			if !strings.Contains(stderr.String(), "panic: ") || !strings.Contains(stderr.String(), in.panic) {
				t.Fatalf("child died (%v) without the expected panic %q; stderr:\n%s", err, in.panic, stderr.String())
			}
			t.Logf("child died as expected: %s", firstLine(stderr.String(), "panic: "))
		})
	}
}

func firstLine(s, prefix string) string {
	for line := range strings.Lines(s) {
		if strings.HasPrefix(line, prefix) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}
