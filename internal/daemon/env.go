package daemon

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
)

// EnvPrefix starts the environment variable of every flag.
const EnvPrefix = "PDLINK_"

// EnvName is the environment variable that sets a flag: --heartbeat-misses
// is PDLINK_HEARTBEAT_MISSES.
func EnvName(flag string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// ApplyEnv sets every flag not given on the command line from its
// environment variable, if present. A flag on the command line wins, so a
// unit file's environment can be overridden by hand.
func ApplyEnv(fs *pflag.FlagSet, lookup func(string) (string, bool)) error {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	var firstErr error
	fs.VisitAll(func(f *pflag.Flag) {
		if firstErr != nil || f.Changed {
			return
		}
		v, ok := lookup(EnvName(f.Name))
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			firstErr = fmt.Errorf("invalid %s=%q for --%s: %v", EnvName(f.Name), v, f.Name, err)
		}
	})
	return firstErr
}
