package testbed

import (
	"fmt"
	"os"
	"os/exec"
)

// BuildDaemons builds prefilld and decoded into a new temporary directory
// named after pattern (os.MkdirTemp) and returns it; the caller removes
// it. They are built without the race detector on purpose: it makes the
// daemons about 15x slower, and the suites' deadlines are seconds. The go
// tool's output goes to stderr.
func BuildDaemons(pattern string) (string, error) {
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", err
	}
	build := exec.Command("go", "build", "-o", dir+"/",
		"github.com/pdlink/pdlink/cmd/prefilld", "github.com/pdlink/pdlink/cmd/decoded")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("building daemons: %w", err)
	}
	return dir, nil
}
