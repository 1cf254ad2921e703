package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/pdlink/pdlink/internal/proc"
	"github.com/pdlink/pdlink/internal/sim"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// benchResult is what `pdctl bench --json` prints. Times are in
// milliseconds, CPU in seconds (user+system), sizes in bytes, rates in
// GB/s (1e9 bytes).
type benchResult struct {
	Requests int `json:"requests"`
	// PrefillTP and DecodeTP are the engines' TP sizes; MLA whether the
	// layout is MLA (every rank the whole latent).
	PrefillTP   int   `json:"prefill_tp"`
	DecodeTP    int   `json:"decode_tp"`
	MLA         bool  `json:"mla"`
	Concurrency int   `json:"concurrency"`
	Buffers     int   `json:"buffers"`
	PageBytes   int64 `json:"page_bytes"` // one page of one buffer on a decode rank
	ChunkPages  int   `json:"chunk_pages"`
	Bytes       int64 `json:"bytes"`
	// SentPages and SentBytes are what the prefill schedulers handed over in
	// Sends (page positions summed over ranks, and those pages' bytes);
	// LandedPages the positions that landed on decode (Bytes' pages);
	// PrefixPages those decode already held, which moved nothing.
	SentPages   int64   `json:"sent_pages"`
	SentBytes   int64   `json:"sent_bytes"`
	LandedPages int64   `json:"landed_pages"`
	PrefixPages int64   `json:"prefix_pages"`
	Seconds     float64 `json:"seconds"`
	GBps        float64 `json:"gb_per_s"`
	RoomsPerSec float64 `json:"rooms_per_s"`
	// Ranks is each rank's share, by side ("prefill", "decode") and rank:
	// bytes a prefill rank sent, bytes that landed on a decode rank.
	Ranks map[string][]rankResult `json:"ranks"`
	// PrefillTokensPerS is the forward-pass model's throughput (0: none).
	PrefillTokensPerS float64 `json:"prefill_tokens_per_s"`
	// LastChunkToSuccess percentiles: from a room's last Send returning to
	// decode Success.
	P50ms float64 `json:"last_chunk_to_success_p50_ms"`
	P99ms float64 `json:"last_chunk_to_success_p99_ms"`
	// FirstSendToSuccess percentiles: from a room's first Send (its first
	// pages handed over) to decode Success.
	FirstSendP50ms float64 `json:"first_send_to_success_p50_ms"`
	FirstSendP99ms float64 `json:"first_send_to_success_p99_ms"`
	// CPU seconds each daemon ("prefill", "decode") spent during the run,
	// and per GB moved; DaemonsCPUPerGB is both together.
	CPUSeconds      map[string]float64 `json:"cpu_seconds"`
	CPUPerGB        map[string]float64 `json:"cpu_seconds_per_gb"`
	DaemonsCPUPerGB float64            `json:"daemons_cpu_seconds_per_gb"`
	// SchedulerCPUSeconds is this pdctl process's own CPU during the run
	// (getrusage RUSAGE_SELF): both simulated schedulers, their gRPC
	// clients, the page allocators and the Go runtime; forward passes are
	// timers and cost nothing. It shares the machine with the daemons.
	SchedulerCPUSeconds float64 `json:"scheduler_cpu_seconds"`
	SchedulerCPUPerGB   float64 `json:"scheduler_cpu_seconds_per_gb"`
	Failures            int     `json:"failures"`
	// References measured in the same run, and the ratios to them.
	Iperf3GBps float64 `json:"iperf3_gb_per_s,omitempty"`
	MemcpyGBps float64 `json:"memcpy_gb_per_s"`
	VsIperf3   float64 `json:"ratio_to_iperf3,omitempty"`
	VsMemcpy   float64 `json:"ratio_to_memcpy"`
	// Iperf3CPUSeconds is the reference run's own CPU ("server",
	// "client": each process's rusage); Iperf3CPUPerGB both per GB it
	// moved; DaemonsCPUVsIperf3 is DaemonsCPUPerGB over it.
	Iperf3CPUSeconds   map[string]float64 `json:"iperf3_cpu_seconds,omitempty"`
	Iperf3CPUPerGB     float64            `json:"iperf3_cpu_seconds_per_gb,omitempty"`
	DaemonsCPUVsIperf3 float64            `json:"ratio_daemons_cpu_per_gb_to_iperf3,omitempty"`
	// Profiles are the daemons' CPU profiles of the run (--profile).
	Profiles []string `json:"profiles,omitempty"`
	Note     string   `json:"note,omitempty"`
}

// defaultPrefillTokensPerS is the forward-pass model's default: an 8B
// model costs about 2 x 8e9 FLOP per prefill token, and one H100-class GPU
// sustains about a third of its 989 dense bf16 TFLOPS in prefill: 320
// TFLOPS / 16 GFLOP = 20,000 tokens/s.
const defaultPrefillTokensPerS = 20000

func newBenchCommand() *cobra.Command {
	var binDir, profileDir, transport string
	var asJSON bool
	cfg := sim.Config{Layout: sim.DemoLayout(), NoVerify: true}
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "a fixed workload through both daemons, beside iperf3 and memcpy references from the same run",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := fitHeads(cmd, &cfg.Layout); err != nil {
				return err
			}
			res, err := runBench(cmd, binDir, profileDir, transport, cfg)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(res)
			}
			fmt.Fprintf(out, "moved %.2f GB in %.2fs: %.2f GB/s, %.1f rooms/s (forward passes at %.0f tokens/s%s)\n",
				float64(res.Bytes)/1e9, res.Seconds, res.GBps, res.RoomsPerSec, res.PrefillTokensPerS, describeRanks(cfg))
			fmt.Fprintf(out, "pages: prefill sent %d (%.3f GB), decode wrote %d, decode's prefix %d\n", res.SentPages, float64(res.SentBytes)/1e9, res.LandedPages, res.PrefixPages)
			printRanks(out, res.Ranks["prefill"], res.Ranks["decode"])
			fmt.Fprintf(out, "decode Success after the last chunk p50 %.1fms p99 %.1fms, after the first Send p50 %.1fms p99 %.1fms\n",
				res.P50ms, res.P99ms, res.FirstSendP50ms, res.FirstSendP99ms)
			fmt.Fprintf(out, "cpu: prefilld %.2fs (%.2f s/GB), decoded %.2fs (%.2f s/GB), both %.2f s/GB; simulated schedulers (pdctl) %.2fs (%.2f s/GB)\n",
				res.CPUSeconds["prefill"], res.CPUPerGB["prefill"], res.CPUSeconds["decode"], res.CPUPerGB["decode"],
				res.DaemonsCPUPerGB, res.SchedulerCPUSeconds, res.SchedulerCPUPerGB)
			fmt.Fprintf(out, "references (same run): memcpy %.2f GB/s -> ratio %.2f", res.MemcpyGBps, res.VsMemcpy)
			if res.Iperf3GBps > 0 {
				fmt.Fprintf(out, "; iperf3 loopback %.2f GB/s -> ratio %.2f, its CPU %.2f s/GB -> daemons' ratio %.2f",
					res.Iperf3GBps, res.VsIperf3, res.Iperf3CPUPerGB, res.DaemonsCPUVsIperf3)
			}
			fmt.Fprintln(out)
			for _, p := range res.Profiles {
				fmt.Fprintln(out, "profile:", p)
			}
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
	f.IntVar(&cfg.ChunkPages, "chunk-pages", 16, "pages each prefill Send hands over (one chunk of chunked prefill)")
	f.Float64Var(&cfg.PrefillTokensPerS, "prefill-tokens-per-s", defaultPrefillTokensPerS,
		"forward-pass throughput of the simulated prefill GPU: each chunk's Send waits chunk tokens / this, and the GPU prefills one request at a time; "+
			"0 = no model, chunks back to back. The default is an 8B model (2 x 8e9 FLOP per token) on one H100-class GPU at about a third of its 989 dense bf16 TFLOPS")
	f.IntVar(&cfg.Layout.Layers, "layers", cfg.Layout.Layers, "model layers (K and V buffer each)")
	f.Int64Var(&cfg.Layout.Pages, "pages", cfg.Layout.Pages, "KV pages per buffer in each engine's region")
	f.Int64Var(&cfg.Layout.BytesPerToken, "bytes-per-token", cfg.Layout.BytesPerToken, "KV bytes per token across all buffers (small values make small rooms)")
	addHeadFlags(f, &cfg.Layout)
	addRankFlags(f, &cfg)
	f.StringVar(&cfg.Dir, "shm-dir", "/dev/shm", "where the run makes its private region directory (the daemons' --region-dir, removed at the end)")
	f.BoolVar(&cfg.NoVerify, "no-verify", true, "skip filling and checking page contents (bytes still move)")
	f.BoolVar(&cfg.LayerWise, "layer-wise", false, "send each chunk one layer at a time (a Send naming the layer's K and V buffers)")
	f.Float64Var(&cfg.PrefixFraction, "prefix-fraction", 0, "fraction of each request's pages decode already holds (prefix_len, 0..1): they stay untouched and move no bytes")
	f.StringVar(&transport, "data-transport", string(transfer.KindAuto), "both daemons' --data-transport: "+transfer.KindNames()+
		" (one host: auto and shm copy pages from prefill's mapping, tcp sends them over loopback)")
	f.StringVar(&profileDir, "profile", "", "write CPU profiles of both daemons for the run to DIR/prefilld.cpu.pprof and DIR/decoded.cpu.pprof (go tool pprof -top reads them)")
	return cmd
}

func runBench(cmd *cobra.Command, binDir, profileDir, transport string, cfg sim.Config) (*benchResult, error) {
	if cfg.PrefillTokensPerS < 0 {
		return nil, fmt.Errorf("--prefill-tokens-per-s %v: must not be negative", cfg.PrefillTokensPerS)
	}
	if err := checkPrefixFraction(cfg.PrefixFraction); err != nil {
		return nil, err
	}
	if err := checkRanks(cfg); err != nil {
		return nil, err
	}
	tl, err := cfg.Layout.RankTransfer(0, cfg.DecodeTP)
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "pdlink-bench-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	regions, err := newRegionDir(&cfg)
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(regions)
	var profiles []string
	if profileDir != "" {
		if err := os.MkdirAll(profileDir, 0o755); err != nil {
			return nil, fmt.Errorf("--profile %s: %w", profileDir, err)
		}
		for _, name := range []string{"prefilld", "decoded"} {
			p, err := filepath.Abs(filepath.Join(profileDir, name+".cpu.pprof"))
			if err != nil {
				return nil, err
			}
			profiles = append(profiles, p)
		}
	}
	quiet := *cmd
	quiet.SetOut(new(bytes.Buffer))
	procs, err := startPair(&quiet, binDir, tmp, []string{"--region-dir=" + regions, "--data-transport=" + transport}, profiles, &cfg)
	defer stopAll(procs)
	if err != nil {
		return nil, err
	}
	cpu0, self0 := cpuOf(procs), selfCPU()
	rep, err := sim.Run(cmd.Context(), cfg)
	if err != nil {
		return nil, err
	}
	if err := noRoomSucceeded(rep, procs); err != nil {
		return nil, err
	}
	cpu1, self1 := cpuOf(procs), selfCPU()
	// The daemons stop before the references run: they write their
	// profiles, and idle daemons do not share the cores with iperf3.
	for _, p := range procs {
		if err := p.Stop(15 * time.Second); err != nil {
			return nil, fmt.Errorf("stopping %s after the run: %w", p.Name, err)
		}
	}
	for _, p := range profiles {
		if st, err := os.Stat(p); err != nil || st.Size() == 0 {
			return nil, fmt.Errorf("--profile: %s not written (%v)", p, err)
		}
	}
	gb := float64(rep.Bytes) / 1e9
	perGB := func(cpu float64) float64 {
		if gb <= 0 {
			return 0
		}
		return cpu / gb
	}
	res := &benchResult{
		Requests: cfg.Requests, PrefillTP: cfg.PrefillTP, DecodeTP: cfg.DecodeTP, MLA: cfg.Layout.MLA, Concurrency: cfg.Concurrency, Buffers: len(tl.Buffers), PageBytes: tl.Buffers[0].ItemLen,
		ChunkPages: cfg.ChunkPages, PrefillTokensPerS: cfg.PrefillTokensPerS,
		Bytes: rep.Bytes, SentPages: rep.SentPages, SentBytes: rep.SentBytes, LandedPages: rep.LandedPages, PrefixPages: rep.PrefixPages,
		Seconds: rep.Elapsed.Seconds(), GBps: rep.GBps(),
		RoomsPerSec: float64(rep.Requests) / rep.Elapsed.Seconds(),
		Ranks: map[string][]rankResult{"prefill": rankResults(rep.PrefillRanks, rep.Elapsed),
			"decode": rankResults(rep.DecodeRanks, rep.Elapsed)},
		P50ms: ms(rep.Percentile(50)), P99ms: ms(rep.Percentile(99)),
		FirstSendP50ms: ms(rep.FirstSendPercentile(50)), FirstSendP99ms: ms(rep.FirstSendPercentile(99)),
		CPUSeconds: map[string]float64{}, CPUPerGB: map[string]float64{},
		SchedulerCPUSeconds: self1 - self0, SchedulerCPUPerGB: perGB(self1 - self0),
		Failures: rep.Requests - rep.Outcomes["decode:success"],
		Profiles: profiles,
	}
	for i, side := range []string{"prefill", "decode"} {
		res.CPUSeconds[side] = cpu1[i] - cpu0[i]
		res.CPUPerGB[side] = perGB(res.CPUSeconds[side])
	}
	res.DaemonsCPUPerGB = perGB(res.CPUSeconds["prefill"] + res.CPUSeconds["decode"])
	res.MemcpyGBps = memcpyGBps()
	res.VsMemcpy = res.GBps / res.MemcpyGBps
	if ref, err := iperf3Reference(cmd.Context()); err == nil {
		res.Iperf3GBps = ref.GBps
		res.VsIperf3 = res.GBps / ref.GBps
		res.Iperf3CPUSeconds = map[string]float64{"server": ref.ServerCPU, "client": ref.ClientCPU}
		res.Iperf3CPUPerGB = (ref.ServerCPU + ref.ClientCPU) / (float64(ref.Bytes) / 1e9)
		if res.Iperf3CPUPerGB > 0 {
			res.DaemonsCPUVsIperf3 = res.DaemonsCPUPerGB / res.Iperf3CPUPerGB
		}
	} else {
		res.Note = "iperf3 reference unavailable: " + err.Error()
	}
	return res, nil
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// selfCPU is this process's user+system CPU seconds so far.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
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

// iperf3Run is one iperf3 reference run: what it moved, and the CPU its
// server and client processes spent (their rusage).
type iperf3Run struct {
	GBps                 float64
	Bytes                int64
	ServerCPU, ClientCPU float64
}

// iperf3Reference runs one iperf3 stream over loopback for 3 seconds.
func iperf3Reference(ctx context.Context) (iperf3Run, error) {
	if _, err := exec.LookPath("iperf3"); err != nil {
		return iperf3Run{}, fmt.Errorf("iperf3 not installed")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return iperf3Run{}, err
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	srv := exec.CommandContext(ctx, "iperf3", "-s", "-1", "-B", "127.0.0.1", "-p", port)
	if err := srv.Start(); err != nil {
		return iperf3Run{}, err
	}
	waited := false
	defer func() {
		if !waited {
			_ = srv.Process.Kill()
			_ = srv.Wait()
		}
	}()
	var ref iperf3Run
	var client *exec.Cmd
	// The server needs a moment to listen. A client that found nobody
	// listening exits 0 under -J and says so only inside its JSON.
	for range 50 {
		client = exec.CommandContext(ctx, "iperf3", "-c", "127.0.0.1", "-p", port, "-t", "3", "-J")
		var out []byte
		if out, err = client.Output(); err != nil {
			err = fmt.Errorf("iperf3 client: %v", err)
		} else if ref, err = iperf3Measure(out); err == nil {
			break
		}
		if ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return iperf3Run{}, err
	}
	// The server (-1) exits after its one test.
	waited = true
	if err := srv.Wait(); err != nil {
		return iperf3Run{}, fmt.Errorf("iperf3 server: %v", err)
	}
	ref.ServerCPU, ref.ClientCPU = cpuSeconds(srv.ProcessState), cpuSeconds(client.ProcessState)
	return ref, nil
}

func cpuSeconds(ps *os.ProcessState) float64 { return (ps.UserTime() + ps.SystemTime()).Seconds() }

// iperf3Rate reads the receiver's rate in GB/s from iperf3 -J output.
func iperf3Rate(out []byte) (float64, error) {
	r, err := iperf3Measure(out)
	return r.GBps, err
}

// iperf3Measure reads the receiver's rate and bytes from iperf3 -J
// output. A run that moved nothing (iperf3 may report its error inside
// the JSON) is no reference: a zero rate would make the ratio +Inf, which
// JSON cannot encode.
func iperf3Measure(out []byte) (iperf3Run, error) {
	var r struct {
		Error string `json:"error"`
		End   struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
				Bytes         int64   `json:"bytes"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return iperf3Run{}, err
	}
	if bps := r.End.SumReceived.BitsPerSecond; r.Error == "" && bps > 0 {
		return iperf3Run{GBps: bps / 8 / 1e9, Bytes: r.End.SumReceived.Bytes}, nil
	}
	return iperf3Run{}, fmt.Errorf("iperf3 measured nothing (error %q)", r.Error)
}
