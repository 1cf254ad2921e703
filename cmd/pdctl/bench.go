package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/pdlink/pdlink/internal/proc"
	"github.com/pdlink/pdlink/internal/sim"
)

// benchResult is what `pdctl bench --json` prints.
type benchResult struct {
	Requests    int     `json:"requests"`
	Concurrency int     `json:"concurrency"`
	Buffers     int     `json:"buffers"`
	PageBytes   int64   `json:"page_bytes"`
	Bytes       int64   `json:"bytes"`
	Seconds     float64 `json:"seconds"`
	GBps        float64 `json:"gb_per_s"`
	RoomsPerSec float64 `json:"rooms_per_s"`
	// LastChunkToSuccess percentiles, milliseconds.
	P50ms float64 `json:"last_chunk_to_success_p50_ms"`
	P99ms float64 `json:"last_chunk_to_success_p99_ms"`
	// CPU seconds each daemon spent during the run, and per GB moved.
	CPUSeconds map[string]float64 `json:"cpu_seconds"`
	CPUPerGB   map[string]float64 `json:"cpu_seconds_per_gb"`
	Failures   int                `json:"failures"`
	// References measured in the same run, and the ratios to them.
	Iperf3GBps float64 `json:"iperf3_gb_per_s,omitempty"`
	MemcpyGBps float64 `json:"memcpy_gb_per_s"`
	VsIperf3   float64 `json:"ratio_to_iperf3,omitempty"`
	VsMemcpy   float64 `json:"ratio_to_memcpy"`
	Note       string  `json:"note,omitempty"`
}

func newBenchCommand() *cobra.Command {
	var binDir string
	var asJSON bool
	cfg := sim.Config{Layout: sim.DemoLayout(), NoVerify: true}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "a fixed workload through both daemons, beside iperf3 and memcpy references from the same run",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			res, err := runBench(cmd, binDir, cfg)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			fmt.Fprintf(out, "moved %.2f GB in %.2fs: %.2f GB/s, %.1f rooms/s, last chunk -> Success p50 %.1fms p99 %.1fms\n",
				float64(res.Bytes)/1e9, res.Seconds, res.GBps, res.RoomsPerSec, res.P50ms, res.P99ms)
			fmt.Fprintf(out, "cpu: prefilld %.2fs (%.2f s/GB), decoded %.2fs (%.2f s/GB)\n",
				res.CPUSeconds["prefill"], res.CPUPerGB["prefill"], res.CPUSeconds["decode"], res.CPUPerGB["decode"])
			fmt.Fprintf(out, "references (same run): memcpy %.2f GB/s -> ratio %.2f", res.MemcpyGBps, res.VsMemcpy)
			if res.Iperf3GBps > 0 {
				fmt.Fprintf(out, "; iperf3 loopback %.2f GB/s -> ratio %.2f", res.Iperf3GBps, res.VsIperf3)
			}
			fmt.Fprintln(out)
			if res.Note != "" {
				fmt.Fprintln(out, "note:", res.Note)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&binDir, "bin-dir", "", "directory holding prefilld and decoded (default: beside pdctl, then PATH)")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	f.IntVar(&cfg.Requests, "requests", 100, "requests to run")
	f.IntVar(&cfg.MinTokens, "min-tokens", 1024, "shortest request, tokens")
	f.IntVar(&cfg.MaxTokens, "max-tokens", 2048, "longest request, tokens")
	f.IntVar(&cfg.Concurrency, "concurrency", 8, "requests in flight")
	f.IntVar(&cfg.Layout.Layers, "layers", cfg.Layout.Layers, "model layers (K and V buffer each)")
	f.Int64Var(&cfg.Layout.Pages, "pages", cfg.Layout.Pages, "KV pages per buffer in each engine's region")
	f.Int64Var(&cfg.Layout.BytesPerToken, "bytes-per-token", cfg.Layout.BytesPerToken, "KV bytes per token across all buffers (small values make small rooms)")
	f.StringVar(&cfg.Dir, "shm-dir", "/dev/shm", "where the engines' region files go")
	f.BoolVar(&cfg.NoVerify, "no-verify", true, "skip filling and checking page contents (bytes still move)")
	return cmd
}

func runBench(cmd *cobra.Command, binDir string, cfg sim.Config) (*benchResult, error) {
	tmp, err := os.MkdirTemp("", "pdlink-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	quiet := *cmd
	quiet.SetOut(new(bytes.Buffer))
	procs, err := startPair(&quiet, binDir, tmp, nil, &cfg)
	defer stopAll(procs)
	if err != nil {
		return nil, err
	}
	cpu0 := cpuOf(procs)
	rep, err := sim.Run(cmd.Context(), cfg)
	if err != nil {
		return nil, err
	}
	cpu1 := cpuOf(procs)
	tl, _ := cfg.Layout.Transfer()
	res := &benchResult{
		Requests: cfg.Requests, Concurrency: cfg.Concurrency, Buffers: len(tl.Buffers), PageBytes: tl.Buffers[0].ItemLen,
		Bytes: rep.Bytes, Seconds: rep.Elapsed.Seconds(), GBps: rep.GBps(),
		RoomsPerSec: float64(rep.Requests) / rep.Elapsed.Seconds(),
		P50ms:       float64(rep.Percentile(50)) / 1e6, P99ms: float64(rep.Percentile(99)) / 1e6,
		CPUSeconds: map[string]float64{}, CPUPerGB: map[string]float64{},
		Failures: rep.Requests - rep.Outcomes["decode:success"],
	}
	for i, side := range []string{"prefill", "decode"} {
		res.CPUSeconds[side] = cpu1[i] - cpu0[i]
		if rep.Bytes > 0 {
			res.CPUPerGB[side] = res.CPUSeconds[side] / (float64(rep.Bytes) / 1e9)
		}
	}
	res.MemcpyGBps = memcpyGBps()
	res.VsMemcpy = res.GBps / res.MemcpyGBps
	if g, err := iperf3GBps(cmd.Context()); err == nil {
		res.Iperf3GBps = g
		res.VsIperf3 = res.GBps / g
	} else {
		res.Note = "iperf3 reference unavailable: " + err.Error()
	}
	return res, nil
}

// cpuOf reads each process's user+system CPU seconds from /proc.
func cpuOf(procs []*proc.Process) []float64 {
	out := make([]float64, len(procs))
	tick := 100.0 // USER_HZ on Linux
	for i, p := range procs {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Cmd.Process.Pid))
		if err != nil {
			continue
		}
		// Fields after the command name (which may hold spaces) start at ')'.
		s := string(b[bytes.LastIndexByte(b, ')')+2:])
		var f []string
		for _, x := range bytes.Fields([]byte(s)) {
			f = append(f, string(x))
		}
		if len(f) > 13 {
			u, _ := strconv.ParseFloat(f[11], 64)
			st, _ := strconv.ParseFloat(f[12], 64)
			out[i] = (u + st) / tick
		}
	}
	return out
}

// memcpyGBps is one thread copying 256 MiB between warm buffers.
func memcpyGBps() float64 {
	const size = 256 << 20
	src, dst := make([]byte, size), make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	copy(dst, src) // fault the pages in
	best := 0.0
	for range 5 {
		start := time.Now()
		copy(dst, src)
		if g := size / time.Since(start).Seconds() / 1e9; g > best {
			best = g
		}
	}
	return best
}

// iperf3GBps runs one iperf3 stream over loopback for 3 seconds.
func iperf3GBps(ctx context.Context) (float64, error) {
	if _, err := exec.LookPath("iperf3"); err != nil {
		return 0, fmt.Errorf("iperf3 not installed")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	srv := exec.CommandContext(ctx, "iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", port)
	if err := srv.Start(); err != nil {
		return 0, err
	}
	defer func() { _ = srv.Wait() }()
	var out []byte
	for range 50 { // the server needs a moment to listen
		out, err = exec.CommandContext(ctx, "iperf3", "-c", "127.0.0.1", "-p", port, "-t", "3", "-J").Output()
		if err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		_ = srv.Process.Kill()
		return 0, fmt.Errorf("iperf3 client: %v", err)
	}
	return iperf3Rate(out)
}

// iperf3Rate reads the receiver's rate in GB/s from iperf3 -J output. A
// run that moved nothing (iperf3 may report its error inside the JSON) is
// no reference: a zero rate would make the ratio +Inf, which JSON cannot
// encode.
func iperf3Rate(out []byte) (float64, error) {
	var r struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return 0, err
	}
	if bps := r.End.SumReceived.BitsPerSecond; r.Error == "" && bps > 0 {
		return bps / 8 / 1e9, nil
	}
	return 0, fmt.Errorf("iperf3 measured nothing (error %q)", r.Error)
}
