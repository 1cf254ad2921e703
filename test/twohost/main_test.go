package twohost

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/pdlink/pdlink/internal/testbed"
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
	dir, err := testbed.BuildDaemons("pdlink-twohost-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	goleak.VerifyTestMain(suite{m})
}

func bin(name string) string { return filepath.Join(binDir, name) }
