package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/pdlink/pdlink/internal/proc"
	"github.com/pdlink/pdlink/internal/sim"
)

func newDemoCommand() *cobra.Command {
	var binDir string
	var faults bool
	cfg := sim.Config{Layout: sim.DemoLayout()}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "start prefilld and decoded on loopback, drive them like real schedulers, report",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := fitHeads(cmd, &cfg.Layout); err != nil {
				return err
			}
			return runDemo(cmd, binDir, faults, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&binDir, "bin-dir", "", "directory holding prefilld and decoded (default: beside pdctl, then PATH)")
	f.BoolVar(&faults, "faults", false, "mix in aborts from both sides and stalled schedulers")
	f.IntVar(&cfg.Requests, "requests", 300, "requests to run")
	f.IntVar(&cfg.MinTokens, "min-tokens", 64, "shortest request, tokens")
	f.IntVar(&cfg.MaxTokens, "max-tokens", 2048, "longest request, tokens")
	f.IntVar(&cfg.Concurrency, "concurrency", 8, "requests in flight")
	f.IntVar(&cfg.Layout.Layers, "layers", cfg.Layout.Layers, "model layers (K and V buffer each)")
	f.Int64Var(&cfg.Layout.BytesPerToken, "bytes-per-token", cfg.Layout.BytesPerToken, "KV bytes per token across all layers")
	f.Int64Var(&cfg.Layout.Pages, "pages", cfg.Layout.Pages, "KV pages per buffer in each engine's region")
	addHeadFlags(f, &cfg.Layout)
	addRankFlags(f, &cfg)
	f.StringVar(&cfg.Dir, "shm-dir", "/dev/shm", "where the run makes its private region directory (the daemons' --region-dir, removed at the end)")
	f.BoolVar(&cfg.LayerWise, "layer-wise", false, "send each chunk one layer at a time (a Send naming the layer's K and V buffers)")
	f.Float64Var(&cfg.PrefixFraction, "prefix-fraction", 0, "fraction of each request's pages decode already holds (prefix_len, 0..1): they stay untouched and move no bytes")
	return cmd
}

func checkPrefixFraction(f float64) error {
	if !(f >= 0 && f <= 1) {
		return fmt.Errorf("--prefix-fraction %v: must be in 0..1", f)
	}
	return nil
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

func runDemo(cmd *cobra.Command, binDir string, faults bool, cfg sim.Config) error {
	if err := checkPrefixFraction(cfg.PrefixFraction); err != nil {
		return err
	}
	if err := checkRanks(cfg); err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	tmp, err := os.MkdirTemp("", "pdlink-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	regions, err := newRegionDir(&cfg)
	if err != nil {
		return err
	}
	defer os.RemoveAll(regions)

	deadlines := []string{"--bootstrap-timeout=10s", "--waiting-timeout=10s", "--transfer-idle-timeout=5s"}
	if faults {
		// Stalled schedulers are only noticed at a deadline: keep them short
		// so the demo shows them failing in seconds.
		deadlines = []string{"--bootstrap-timeout=2s", "--waiting-timeout=2s", "--transfer-idle-timeout=2s"}
		cfg.Faults = sim.Faults{AbortPrefill: 0.05, AbortDecode: 0.05, StallDecode: 0.03, StallPrefill: 0.03}
	}
	procs, err := startPair(cmd, binDir, tmp, append(deadlines, "--region-dir="+regions), nil, &cfg)
	defer stopAll(procs)
	if err != nil {
		return err
	}
	cfg.PinBound = 60 * time.Second
	cfg.Progress = progressPrinter(out)
	tl, err := cfg.Layout.RankTransfer(0, cfg.DecodeTP)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "layout: %d buffers x %d pages of %d KiB (%d tokens/page, %s%s), %d requests of %d..%d tokens, %d in flight\n",
		len(tl.Buffers), tl.Buffers[0].Pages(), tl.Buffers[0].ItemLen>>10, cfg.Layout.PageTokens, describeHeads(cfg.Layout, cfg.DecodeTP),
		describeRanks(cfg), cfg.Requests, cfg.MinTokens, cfg.MaxTokens, cfg.Concurrency)
	engines, err := sim.New(cmd.Context(), cfg)
	if err != nil {
		return err
	}
	defer engines.Close()
	var restart *restartInfo
	waitRestart := func() {} // returns once the restart goroutine is done with procs
	if faults {
		// A peer restart mid-run: kill -9 decoded once 40% of the rooms
		// ended, start it again, and let the engine register its region
		// with the new process. Rooms bound to the dead instance must end
		// (peer_lost on prefill within the heartbeat bound), new ones work.
		restart = &restartInfo{}
		progress := cfg.Progress
		var once sync.Once
		restartDone := make(chan struct{})
		runDone := make(chan struct{})
		var waitOnce sync.Once
		waitRestart = func() { waitOnce.Do(func() { close(runDone); <-restartDone }) }
		defer waitRestart()
		trigger := make(chan int, 1)
		cfg.Progress = func(done, total int) {
			progress(done, total)
			if done >= total*2/5 {
				once.Do(func() { trigger <- done })
			}
		}
		go func() {
			defer close(restartDone)
			var at int
			select {
			case at = <-trigger:
			case <-runDone:
				return
			case <-cmd.Context().Done():
				return
			}
			restart.atRoom = at
			start := time.Now()
			np, err := procs[1].Restart(cmd.Context(), nil, 15*time.Second)
			if err != nil {
				restart.err = err
				return
			}
			procs[1] = np
			restart.err = engines.Register(cmd.Context())
			restart.took = time.Since(start)
		}()
	}
	rep, err := engines.Run(cmd.Context(), cfg)
	waitRestart()
	fmt.Fprintln(out)
	if rep == nil {
		return err
	}
	printReport(out, rep, procs)
	if restart != nil {
		if restart.err != nil {
			fmt.Fprintf(out, "peer restart: FAILED: %v\n", restart.err)
		} else if restart.atRoom > 0 {
			fmt.Fprintf(out, "peer restart: decoded killed -9 after %d rooms ended, back and registered in %v; the rooms in flight on it ended (prefill:peer_lost, peer_restarted or transfer_error above), none pinned\n",
				restart.atRoom, restart.took.Round(time.Millisecond))
		}
	}
	if err != nil {
		return err
	}
	if rep.Pinned > 0 || rep.Corrupt > 0 || rep.LateWrites > 0 {
		return fmt.Errorf("demo found %d pinned rooms, %d corrupt rooms, %d late writes", rep.Pinned, rep.Corrupt, rep.LateWrites)
	}
	return noRoomSucceeded(rep, procs)
}

func printReport(out io.Writer, rep *sim.Report, procs []*proc.Process) {
	fmt.Fprintf(out, "\nrooms:        %d in %v\n", rep.Requests, rep.Elapsed.Round(time.Millisecond))
	keys := make([]string, 0, len(rep.Outcomes))
	for k := range rep.Outcomes {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(out, "  %-40s %d\n", k, rep.Outcomes[k])
	}
	if len(rep.Faults) > 0 {
		fmt.Fprintln(out, "faults injected:")
		for k, v := range rep.Faults {
			fmt.Fprintf(out, "  %-40s %d\n", k, v)
		}
	}
	fmt.Fprintf(out, "verified:     %d rooms byte for byte, %d corrupt, %d with writes after Failed (R7)\n", rep.Verified, rep.Corrupt, rep.LateWrites)
	fmt.Fprintf(out, "pinned:       %d (rooms that did not end within their bound)\n", rep.Pinned)
	fmt.Fprintf(out, "worst time to terminal: %v\n", rep.WorstTerminal.Round(time.Millisecond))
	fmt.Fprintf(out, "goodput:      %.2f GB/s (%.2f GB in successful rooms), %.1f rooms/s\n", rep.GBps(), float64(rep.Bytes)/1e9,
		float64(rep.Outcomes["decode:success"])/rep.Elapsed.Seconds())
	fmt.Fprintln(out, describePages(rep))
	printRanks(out, rankResults(rep.PrefillRanks, rep.Elapsed), rankResults(rep.DecodeRanks, rep.Elapsed))
	fmt.Fprintf(out, "last chunk -> decode Success: p50 %v  p99 %v\n", rep.Percentile(50).Round(time.Microsecond), rep.Percentile(99).Round(time.Microsecond))
	for _, p := range procs {
		fmt.Fprintf(out, "%s: inflight now %s; metrics http://%s/metrics\n", p.Name, scrape(p.HTTPAddr, "pdlink_inflight_rooms"), p.HTTPAddr)
	}
}

// describePages is the report's line on what each side's engine moved in
// the successful rooms: the pages (positions, summed over ranks) and bytes
// prefill's schedulers handed over in Sends beside those that landed on
// decode, and the prefix positions decode held, which moved nothing.
func describePages(rep *sim.Report) string {
	line := fmt.Sprintf("pages:        prefill sent %d (%.3f GB), decode wrote %d (%.3f GB)",
		rep.SentPages, float64(rep.SentBytes)/1e9, rep.LandedPages, float64(rep.Bytes)/1e9)
	if rep.PrefixPages > 0 {
		line += fmt.Sprintf("; %d prefix pages decode held moved nothing", rep.PrefixPages)
	}
	return line
}

func scrape(addr, metric string) string {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return "?"
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, metric+"{") || strings.HasPrefix(line, metric+" ") {
			return line[strings.LastIndexByte(line, ' ')+1:]
		}
	}
	return "?"
}

// restartInfo is what the demo's peer restart did.
type restartInfo struct {
	atRoom int
	took   time.Duration
	err    error
}

func stopAll(procs []*proc.Process) {
	for _, p := range procs {
		_ = p.Stop(15 * time.Second)
	}
}

// newRegionDir makes the run's private region directory under cfg.Dir
// (--shm-dir) and points cfg at it: the engines create their regions there
// and the daemons, given it as --region-dir, map nothing else. Symlinks on
// the way are resolved first, since the daemons refuse a path through one.
// The caller removes it.
func newRegionDir(cfg *sim.Config) (string, error) {
	parent := cfg.Dir
	if parent == "" {
		parent = "/dev/shm"
	}
	parent, err := filepath.Abs(parent)
	if err != nil {
		return "", fmt.Errorf("--shm-dir: %w", err)
	}
	if parent, err = filepath.EvalSymlinks(parent); err != nil {
		return "", fmt.Errorf("--shm-dir: %w", err)
	}
	dir, err := os.MkdirTemp(parent, "pdlink-regions-")
	if err != nil {
		return "", fmt.Errorf("--shm-dir: %w", err)
	}
	cfg.Dir = dir
	return dir, nil
}

// startPair starts prefilld and decoded as child processes on loopback
// and points cfg at them; cpuProfiles, if given, are where each writes
// its CPU profile (prefilld's, then decoded's). The processes started so
// far are returned even on error, for the caller to stop.
func startPair(cmd *cobra.Command, binDir, tmp string, extra, cpuProfiles []string, cfg *sim.Config) ([]*proc.Process, error) {
	out := cmd.OutOrStdout()
	var procs []*proc.Process
	for i, d := range []struct{ name, extra string }{
		{"prefilld", "--bootstrap-listen=tcp://127.0.0.1:0"},
		{"decoded", "--data-listen=127.0.0.1:0"},
	} {
		bin, err := findBinary(binDir, d.name)
		if err != nil {
			return procs, fmt.Errorf("%s not found (run `make build`): %w", d.name, err)
		}
		args := append([]string{
			"--grpc-listen=unix://" + filepath.Join(tmp, d.name+".sock"),
			"--http-listen=127.0.0.1:0", d.extra,
		}, extra...)
		if i < len(cpuProfiles) {
			args = append(args, "--cpu-profile="+cpuProfiles[i])
		}
		p, err := proc.Start(cmd.Context(), bin, args, 15*time.Second)
		if err != nil {
			return procs, err
		}
		procs = append(procs, p)
		if d.name == "prefilld" {
			cfg.Bootstrap = p.LogField("bootstrap socket bound", "addr")
			cfg.PrefillGRPC = "unix://" + p.GRPCAddr
		} else {
			cfg.DecodeGRPC = "unix://" + p.GRPCAddr
		}
		fmt.Fprintf(out, "%-9s pid %-7d grpc=%s  metrics=http://%s/metrics  rooms=http://%s/debug/rooms\n",
			d.name, p.Cmd.Process.Pid, p.GRPCAddr, p.HTTPAddr, p.HTTPAddr)
	}
	if cfg.Bootstrap == "" {
		return procs, fmt.Errorf("prefilld did not log its bootstrap address")
	}
	return procs, nil
}

// progressPrinter draws a bar redrawn in place on a terminal; anywhere else
// (CI logs, a pipe) it prints a line every tenth of the rooms, since 300
// redraws joined by carriage returns are one 15 KB line in a log.
func progressPrinter(out io.Writer) func(done, total int) {
	f, isFile := out.(*os.File)
	tty := false
	if isFile {
		if st, err := f.Stat(); err == nil {
			tty = st.Mode()&os.ModeCharDevice != 0
		}
	}
	var mu sync.Mutex
	shown := 0 // highest count shown: calls come from many rooms' goroutines
	return func(done, total int) {
		mu.Lock()
		defer mu.Unlock()
		if done <= shown {
			return
		}
		if tty {
			shown = done
			const width = 40
			n := done * width / total
			fmt.Fprintf(out, "\r[%s%s] %d/%d rooms", strings.Repeat("#", n), strings.Repeat(".", width-n), done, total)
			return
		}
		if done*10/total > shown*10/total || done == total {
			shown = done
			fmt.Fprintf(out, "%d/%d rooms\n", done, total)
		}
	}
}
