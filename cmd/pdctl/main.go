// Command pdctl is the operator and load tool for pdlink: `pdctl demo`
// starts both daemons on loopback and drives them like real schedulers.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/pdlink/pdlink/internal/daemon"
)

// version is set by the linker (-X main.version=...).
var version string

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "pdctl",
		Short:         "pdlink operator and load tool",
		Version:       daemon.Version(version),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newDemoCommand(), newBenchCommand(), newRoomsCommand(), newWatchCommand())
	daemon.AcceptSingleDashHelp(root)
	return root
}

func main() {
	root := newRootCommand()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "pdctl: %v\n", err)
		stop()
		os.Exit(1)
	}
}
