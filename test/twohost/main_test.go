package twohost

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

var binDir string

// suite runs the tests, then removes the binaries, before goleak looks
// for goroutines the tests left behind.
type suite struct{ m *testing.M }

func (s suite) Run() int {
	defer os.RemoveAll(binDir)
	return s.m.Run()
}

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		// Every test skips, saying why (newHosts); nothing to build.
		goleak.VerifyTestMain(m)
	}
	if removed := removeLeftovers(); len(removed) > 0 {
		fmt.Fprintf(os.Stderr, "removed namespaces left by runs that died: %v\n", removed)
	}
	dir, err := os.MkdirTemp("", "pdlink-twohost-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	// No -race: the daemons' deadlines are seconds (see test/chaos).
	build := exec.Command("go", "build", "-o", dir+"/", "../../cmd/prefilld", "../../cmd/decoded")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building daemons:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	goleak.VerifyTestMain(suite{m})
}

func bin(name string) string { return filepath.Join(binDir, name) }
