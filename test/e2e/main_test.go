package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

var binDir string

// regionRoot is every daemon's --region-dir: the suite's regions are made
// in a directory of their test under it (regionDir).
var regionRoot string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pdlink-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	build := exec.Command("go", "build", "-o", dir+"/", "../../cmd/...")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building daemons:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	regions, err := os.MkdirTemp("/dev/shm", "pdlink-e2e-regions-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "region directory:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	regionRoot = regions
	code := m.Run()
	os.RemoveAll(dir)
	os.RemoveAll(regions)
	os.Exit(code)
}

// regionDir is a directory for the test's regions under the daemons'
// --region-dir, removed when the test ends.
func regionDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp(regionRoot, "test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func bin(name string) string { return filepath.Join(binDir, name) }
