package daemon

import (
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/spf13/pflag"
)

// bindProfileFlags registers --cpu-profile. It is a flag and not an opt-in
// /debug/pprof on the HTTP listener: the profile covers exactly the
// process's life (what `pdctl bench --profile` measures), nobody has to
// time a fetch, and the metrics listener, which may be reachable from
// other hosts, gains no endpoint.
func (c *Config) bindProfileFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.CPUProfile, "cpu-profile", c.CPUProfile, "write a CPU profile of the whole run to this file (go tool pprof reads it; written at shutdown, so only after SIGTERM or SIGINT)")
}

// startCPUProfile profiles the process into path until the returned stop
// runs; with path "" it does nothing. stop flushes the profile and closes
// the file.
func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, &FlagError{"cpu-profile", path, err.Error()}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, &FlagError{"cpu-profile", path, fmt.Sprintf("cannot start profiling: %v", err)}
	}
	return func() error {
		pprof.StopCPUProfile()
		return f.Close()
	}, nil
}
