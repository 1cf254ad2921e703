package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
)

// Setup adds a role's services, handlers and components to a bound Server.
type Setup func(s *Server, cfg Config, log *zap.Logger) error

// NewCommand is the cobra root command of a daemon: flags (and their
// environment variables) into a Config, validation, then Run until SIGTERM.
func NewCommand(role Role, version string, short string, setup Setup) *cobra.Command {
	cfg := DefaultConfig(role)
	cmd := &cobra.Command{
		Use:           string(role),
		Short:         short,
		Version:       Version(version),
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := ApplyEnv(cmd.Flags(), nil); err != nil {
				return err
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			log, err := NewLogger(cfg.LogLevel, cfg.LogFormat)
			if err != nil {
				return err
			}
			defer func() { _ = log.Sync() }()
			stopProfile, err := startCPUProfile(cfg.CPUProfile)
			if err != nil {
				return err
			}
			defer func() {
				if err := stopProfile(); err != nil {
					log.Warn("cpu profile not written", zap.String("path", cfg.CPUProfile), zap.Error(err))
				}
			}()
			if cfg.InsecureMode() {
				log.Warn("running without authentication on addresses other hosts can reach: anyone who reaches them can register, abort rooms or receive KV cache",
					zap.Strings("exposed", cfg.Exposed))
			}
			srv, err := NewServer(cfg, log, Version(version))
			if err != nil {
				return err
			}
			if setup != nil {
				if err := setup(srv, cfg, log); err != nil {
					return err
				}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, os.Interrupt)
			defer stop()
			return srv.Run(ctx)
		},
	}
	cmd.SetVersionTemplate("{{.Name}} {{.Version}}\n")
	cfg.BindFlags(cmd.Flags())
	AcceptSingleDashHelp(cmd)
	return cmd
}

// AcceptSingleDashHelp makes `-help` print the help of cmd and of every
// subcommand, as `-h` and `--help` do. pflag reads `-help` as the
// shorthands h, e, l, p and fails on e ("unknown shorthand flag: 'e' in
// -elp"); that exact failure is turned into a help request.
func AcceptSingleDashHelp(cmd *cobra.Command) {
	next := cmd.FlagErrorFunc()
	cmd.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		var unknown *pflag.NotExistError
		if errors.As(err, &unknown) && unknown.GetSpecifiedName() == "e" && unknown.GetSpecifiedShortnames() == "elp" {
			return pflag.ErrHelp
		}
		return next(c, err)
	})
}

// Main runs a daemon command and exits: 0 after a clean stop, 1 with one
// line on stderr otherwise.
func Main(cmd *cobra.Command) {
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", cmd.Name(), err)
		os.Exit(1)
	}
}

// Version is the linker-set version or, failing that, the module version
// and VCS revision the binary was built from.
func Version(linked string) string {
	if linked != "" {
		return linked
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := bi.Main.Version
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += "+" + s.Value[:12]
		}
	}
	return v
}
