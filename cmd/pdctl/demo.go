package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/pdlink/pdlink/internal/proc"
)

func newDemoCommand() *cobra.Command {
	var binDir string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "start prefilld and decoded on loopback and report what they do",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDemo(cmd, binDir)
		},
	}
	cmd.Flags().StringVar(&binDir, "bin-dir", "", "directory holding prefilld and decoded (default: beside pdctl, then PATH)")
	return cmd
}

func findBinary(dir, name string) (string, error) {
	if dir != "" {
		return filepath.Join(dir, name), nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return exec.LookPath(name)
}

func runDemo(cmd *cobra.Command, binDir string) error {
	out := cmd.OutOrStdout()
	tmp, err := os.MkdirTemp("", "pdlink-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	var procs []*proc.Process
	defer func() {
		for _, p := range procs {
			_ = p.Stop(10 * time.Second)
		}
	}()
	for _, d := range []struct{ name, extra string }{
		{"prefilld", "--bootstrap-listen=tcp://127.0.0.1:0"},
		{"decoded", "--data-listen=127.0.0.1:0"},
	} {
		bin, err := findBinary(binDir, d.name)
		if err != nil {
			return fmt.Errorf("%s not found (run `make build`): %w", d.name, err)
		}
		p, err := proc.Start(cmd.Context(), bin, []string{
			"--grpc-listen=unix://" + filepath.Join(tmp, d.name+".sock"),
			"--http-listen=127.0.0.1:0",
			d.extra,
		}, 15*time.Second)
		if err != nil {
			return err
		}
		procs = append(procs, p)
		fmt.Fprintf(out, "%-9s serving  grpc=%s  metrics=http://%s/metrics  ready=%s\n",
			d.name, p.GRPCAddr, p.HTTPAddr, probe("http://"+p.HTTPAddr+"/readyz"))
	}
	fmt.Fprintln(out, `
demo: both daemons start, serve /healthz, /readyz and /metrics, and stop on SIGTERM.
demo: NOT YET moving KV bytes: the room state machine, control plane and data
demo: plane are not wired into the daemons yet, so no transfer is simulated and
demo: no throughput is reported. Nothing here pretends otherwise.`)
	return nil
}

func probe(url string) string {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode == 200 {
		return "yes"
	}
	return resp.Status
}
