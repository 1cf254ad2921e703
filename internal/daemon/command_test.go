package daemon

import (
	"bytes"
	"strings"
	"testing"
)

// `prefilld -help` printed "unknown shorthand flag: 'e' in -elp"; it must
// print the help like -h and --help, and still refuse real unknown flags.
func TestSingleDashHelpPrintsTheHelp(t *testing.T) {
	for _, role := range []Role{RolePrefill, RoleDecode} {
		for _, arg := range []string{"-help", "-h", "--help"} {
			cmd := NewCommand(role, "test", "a daemon", nil)
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SetArgs([]string{arg})
			if err := cmd.Execute(); err != nil {
				t.Errorf("%s %s: %v", role, arg, err)
				continue
			}
			if !strings.Contains(out.String(), "Usage:") || !strings.Contains(out.String(), "--grpc-listen") {
				t.Errorf("%s %s printed %q, want the help", role, arg, out.String())
			}
		}
	}
	for _, arg := range []string{"-helpx", "-e", "--hel"} {
		cmd := NewCommand(RolePrefill, "test", "a daemon", nil)
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetArgs([]string{arg})
		if err := cmd.Execute(); err == nil {
			t.Errorf("prefilld %s accepted", arg)
		}
	}
}
