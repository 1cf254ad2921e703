package deploy

import (
	"bytes"
	"context"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

var update = flag.Bool("update", false, "rewrite the generated deploy files (env files, PrometheusRule)")

// tool returns the path of an external program a test needs. A missing tool
// skips the test, except under CI=true where every tool must be installed
// (scripts/deps.sh installs them).
func tool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s not found and CI=true: install the Debian package %s (scripts/deps.sh)", name, pkg)
	}
	t.Skipf("%s not found: install the Debian package %s to run this test", name, pkg)
	return ""
}

// run runs a command with a deadline and returns its combined output.
func run(t *testing.T, timeout time.Duration, dir string, name string, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.WaitDelay = time.Second
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %v: timed out after %s\n%s", name, args, timeout, out.Bytes())
	}
	return out.Bytes(), err
}

// readFile reads a file under deploy/.
func readFile(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.FromSlash(path))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// golden compares got with the file at path, or rewrites the file under
// -update.
func golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(filepath.FromSlash(path), got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want := readFile(t, path)
	if !bytes.Equal(want, got) {
		t.Errorf("%s is out of date: run go test ./deploy -run %s -update and review the diff", path, t.Name())
	}
}

type pflagFlag = pflag.Flag

// execGo runs the go command; go test puts its own GOROOT/bin first in PATH.
func execGo(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "go", args...)
}
