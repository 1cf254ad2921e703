package transfer

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/rankmap"
)

// The data-plane benchmarks run the receiver in a child process (this test binary
// re-executed with benchChildEnv set), like the two daemons, so each side's CPU can be
// measured: the sender from getrusage, the receiver from /proc/<pid>/stat. Each room moves
// 64 MiB (two buffers); rooms rotate over a 512 MiB destination region so writes land in
// memory that is not cache-hot, as in a real decode engine.
const (
	benchChildEnv  = "PDLINK_TRANSFER_BENCH_CHILD"
	benchRoomBytes = 64 << 20
)

type benchShape struct {
	name      string
	itemLen   int64 // bytes a page moves (a sliced shape's: the slice's)
	dstPages  int64 // per buffer
	srcPages  int64 // per buffer
	scattered bool
	// prefillTP and decodeTP, set, make a sliced shape: rank 0 of each side of a model of
	// 8 KV heads of 256 bytes (head_dim 128, bf16) in 64-token pages, the stream moving
	// Mapping.CopiesFrom(0, 0).
	prefillTP, decodeTP int
}

var (
	shape1MiB      = benchShape{name: "1MiB", itemLen: 1 << 20, dstPages: 256, srcPages: 64}
	shape64KiBScat = benchShape{name: "64KiBScattered", itemLen: 64 << 10, dstPages: 4096, srcPages: 1024, scattered: true}
	// shape32KiB is whole pages of the size the sliced shapes move per page.
	shape32KiB = benchShape{name: "whole32KiB", itemLen: 32 << 10, dstPages: 8192, srcPages: 1024}
	// shape2to4: 64 KiB prefill pages, half of each token's heads to 32 KiB decode pages
	// (the sender gathers 64 rows of 512 bytes per page).
	shape2to4 = benchShape{name: "mha2to4", itemLen: 32 << 10, dstPages: 8192, srcPages: 1024, prefillTP: 2, decodeTP: 4}
	// shape4to2: 32 KiB prefill pages whole into half of each row of 64 KiB decode pages
	// (the receiver scatters 64 rows of 512 bytes per page).
	shape4to2 = benchShape{name: "mha4to2", itemLen: 32 << 10, dstPages: 4096, srcPages: 1024, prefillTP: 4, decodeTP: 2}
)

func benchShapeByName(n string) benchShape {
	for _, s := range []benchShape{shape1MiB, shape32KiB, shape2to4, shape4to2} {
		if n == s.name {
			return s
		}
	}
	return shape64KiBScat
}

func (s benchShape) layout(pages int64) Layout { return UniformLayout(2, pages, s.itemLen, 0, 0) }

// sideLayout is rank 0's layout of pages pages per buffer on a side of TP size tp.
func (s benchShape) sideLayout(pages int64, tp int) Layout {
	const tokens, heads, headBytes = 64, 8, 256
	l := UniformLayout(2, pages, tokens*int64(max(heads/tp, 1))*headBytes, 0, 0)
	l.Rank = Rank{Size: uint16(tp)}
	return l.WithHeads(rankmap.MHA, tokens, heads, headBytes)
}

func (s benchShape) srcLayout() Layout {
	if s.prefillTP == 0 {
		return s.layout(s.srcPages)
	}
	return s.sideLayout(s.srcPages, s.prefillTP)
}

func (s benchShape) dstLayout() Layout {
	if s.prefillTP == 0 {
		return s.layout(s.dstPages)
	}
	return s.sideLayout(s.dstPages, s.decodeTP)
}

// copies are what prefill rank 0 sends decode rank 0 (nil: whole pages).
func (s benchShape) copies() []rankmap.Copy {
	if s.prefillTP == 0 {
		return nil
	}
	m, err := PlanRanks(s.srcLayout(), s.dstLayout())
	if err != nil {
		panic(err)
	}
	return m.CopiesFrom(0, 0)
}

func (s benchShape) pagesPerRoom() int64 { return benchRoomBytes / 2 / s.itemLen }

// plan returns room i's source and destination page runs (the same for both buffers).
func (s benchShape) plan(i int) (src, dst []Run) {
	n := s.pagesPerRoom()
	if !s.scattered {
		so := (int64(i) * n) % s.srcPages
		do := (int64(i) * n) % s.dstPages
		return []Run{{int32(so), int32(n)}}, []Run{{int32(do), int32(n)}}
	}
	perm := func(pages int64, seed uint64) []int32 {
		r := rand.New(rand.NewPCG(seed, 1))
		p := make([]int32, pages)
		for k := range p {
			p[k] = int32(k)
		}
		r.Shuffle(len(p), func(a, b int) { p[a], p[b] = p[b], p[a] })
		return p
	}
	sp := perm(s.srcPages, 1)
	dp := perm(s.dstPages, 2)
	so := (int64(i) * n) % s.srcPages
	do := (int64(i) * n) % s.dstPages
	return RunsFromPages(sp[so : so+n]), RunsFromPages(dp[do : do+n])
}

// benchReceiverChild is the receiver process: it maps the region named in the environment,
// listens on loopback, prints its address, then registers "expect <i>" rooms from stdin.
func benchReceiverChild() int {
	sh := benchShapeByName(os.Getenv("PDLINK_BENCH_SHAPE"))
	// The receiver's side of a profile: the parent's -test.cpuprofile sees only the sender.
	if path := os.Getenv("PDLINK_BENCH_RECEIVER_CPUPROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	cs, _ := ParseChecksum(os.Getenv("PDLINK_BENCH_CHECKSUM"))
	region, err := OpenRegion(os.Getenv("PDLINK_BENCH_REGION"), sh.dstLayout())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var rcv *Receiver
	ev := &childEvents{fence: func(k Key) { rcv.Fence(k) }}
	piece, _ := strconv.Atoi(os.Getenv("PDLINK_BENCH_PIECE"))          // tuning knob, 0 = default
	kind := Kind(os.Getenv("PDLINK_BENCH_TRANSPORT"))                  // "" = tcp
	workers, _ := strconv.Atoi(os.Getenv("PDLINK_BENCH_COPY_WORKERS")) // tuning knob, 0 = default
	if rcv, err = NewReceiver(region, ReceiverConfig{Checksum: cs, PieceBytes: piece, CopyWorkers: workers, Transport: kind}, ev); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go rcv.Serve(ln)
	fmt.Printf("addr %s\n", ln.Addr())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		i, _ := strconv.Atoi(strings.TrimPrefix(in.Text(), "expect "))
		_, dst := sh.plan(i)
		if err := rcv.Expect(Expectation{Key: Key{Room: uint64(i), Nonce: 1}, Dst: SamePages(2, dst), AuxRow: -1, Copies: sh.copies()}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("ok")
	}
	rcv.Close()
	return 0
}

type childEvents struct{ fence func(Key) }

func (e *childEvents) Progress(Key, int64)             {}
func (e *childEvents) Complete(k Key)                  { e.fence(k) }
func (e *childEvents) Failed(k Key, _ Reason, _ error) { e.fence(k) }

func cpuSelf() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cpuOf reads a process's user+system time from /proc (clock ticks of 10ms).
func cpuOf(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

func benchTransfer(b *testing.B, sh benchShape, cs Checksum) { benchTransferOver(b, sh, cs, KindTCP) }

// benchTransferOver is benchTransfer with both sides on --data-transport kind.
func benchTransferOver(b *testing.B, sh benchShape, cs Checksum, kind Kind) {
	dir := "/dev/shm"
	if _, err := os.Stat(dir); err != nil {
		dir = b.TempDir()
	}
	dstPath, err := CreateRegionFile(dir, sh.dstLayout())
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(dstPath)
	src := openTestRegion(b, sh.srcLayout())
	for i := 0; i < 2; i++ {
		fill(src.Buffer(i), uint64(i+1))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), benchChildEnv+"=1", "PDLINK_BENCH_SHAPE="+sh.name,
		"PDLINK_BENCH_CHECKSUM="+string(cs), "PDLINK_BENCH_REGION="+dstPath, "PDLINK_BENCH_TRANSPORT="+string(kind))
	cmd.Stderr = os.Stderr
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	out := bufio.NewScanner(stdout)
	if !out.Scan() {
		b.Fatal("receiver child did not start")
	}
	addr := strings.TrimPrefix(out.Text(), "addr ")
	expect := func(i int) {
		fmt.Fprintf(stdin, "expect %d\n", i)
		if !out.Scan() || out.Text() != "ok" {
			b.Fatalf("receiver child: %q", out.Text())
		}
	}
	chunk, _ := strconv.ParseInt(os.Getenv("PDLINK_BENCH_CHUNK"), 10, 64)       // tuning knob, 0 = default
	inflight, _ := strconv.ParseInt(os.Getenv("PDLINK_BENCH_INFLIGHT"), 10, 64) // tuning knob, 0 = default
	snd, err := NewSender(src, SenderConfig{ConnsPerPeer: 1, Checksum: cs, MaxChunkBytes: chunk, MaxInflightBytes: inflight, Transport: kind})
	if err != nil {
		b.Fatal(err)
	}
	defer snd.Close()
	if err := snd.AddPeer(addr, sh.dstLayout()); err != nil {
		b.Fatal(err)
	}
	const depth = 2 // rooms in flight, so the stream does not idle between rooms
	dones := make(chan error, b.N+depth)
	send := func(i int) {
		expect(i)
		s, d := sh.plan(i)
		if err := snd.Send(context.Background(), SendRequest{Peer: addr, Key: Key{Room: uint64(i), Nonce: 1},
			Src: SamePages(2, s), Dst: SamePages(2, d), Copies: sh.copies(), Done: func(err error) { dones <- err }}); err != nil {
			b.Fatal(err)
		}
	}
	send(b.N + depth) // warm the connection with a room index the loop does not use
	if err := <-dones; err != nil {
		b.Fatal(err)
	}
	b.SetBytes(benchRoomBytes)
	b.ResetTimer()
	start, sc, rc := time.Now(), cpuSelf(), cpuOf(cmd.Process.Pid)
	for i := 0; i < min(depth, b.N); i++ {
		send(i)
	}
	for i := 0; i < b.N; i++ {
		if err := <-dones; err != nil {
			b.Fatal(err)
		}
		if i+depth < b.N {
			send(i + depth)
		}
	}
	el := time.Since(start)
	b.StopTimer()
	gb := float64(b.N) * benchRoomBytes / 1e9
	b.ReportMetric(gb/el.Seconds(), "GB/s")
	b.ReportMetric((cpuSelf()-sc).Seconds()/gb, "snd-cpu-s/GB")
	b.ReportMetric((cpuOf(cmd.Process.Pid)-rc).Seconds()/gb, "rcv-cpu-s/GB")
}

func BenchmarkTCP_1MiB(b *testing.B) {
	b.Run("crc32c", func(b *testing.B) { benchTransfer(b, shape1MiB, ChecksumCRC32C) })
	b.Run("none", func(b *testing.B) { benchTransfer(b, shape1MiB, ChecksumNone) })
}

func BenchmarkTCP_64KiBScattered(b *testing.B) {
	b.Run("crc32c", func(b *testing.B) { benchTransfer(b, shape64KiBScat, ChecksumCRC32C) })
	b.Run("none", func(b *testing.B) { benchTransfer(b, shape64KiBScat, ChecksumNone) })
}

// BenchmarkSlicedTransfer moves 64 MiB rooms of head slices, 32 KiB per page and buffer,
// beside the same bytes as whole 32 KiB pages: prefill 2 -> decode 4 (the sender gathers
// each token's half of the heads by iovec) and 4 -> 2 (the receiver scatters each source
// page into half of each destination row). Compare ns/op or MB/s with whole32KiB.
func BenchmarkSlicedTransfer(b *testing.B) {
	for _, sh := range []benchShape{shape32KiB, shape2to4, shape4to2} {
		b.Run(sh.name, func(b *testing.B) { benchTransfer(b, sh, ChecksumCRC32C) })
	}
}

// BenchmarkMemcpyReference copies a room's worth of bytes (64 MiB) with one thread between
// two pre-faulted shared mappings, rotating over the destination like the transfer benchmarks.
func BenchmarkMemcpyReference(b *testing.B) {
	sh := shape1MiB
	src := openTestRegion(b, sh.layout(sh.srcPages))
	dst := openTestRegion(b, sh.layout(sh.dstPages))
	fill(src.Buffer(0), 1)
	half := int64(benchRoomBytes / 2)
	b.SetBytes(benchRoomBytes)
	b.ResetTimer()
	start, cpu := time.Now(), cpuSelf()
	for i := 0; i < b.N; i++ {
		off := (int64(i) * half) % int64(len(dst.Buffer(0)))
		copy(dst.Buffer(0)[off:off+half], src.Buffer(0)[:half])
		copy(dst.Buffer(1)[off:off+half], src.Buffer(0)[half:2*half])
	}
	gb := float64(b.N) * benchRoomBytes / 1e9
	b.ReportMetric(gb/time.Since(start).Seconds(), "GB/s")
	// The copying thread's CPU per GB, in the sender's column: on a loaded machine GB/s
	// follows the CPU share a process gets, CPU per GB much less so.
	b.ReportMetric((cpuSelf()-cpu).Seconds()/gb, "snd-cpu-s/GB")
}

// BenchmarkIperf3Reference runs iperf3 single stream over loopback for 3 s (once per call)
// and reports its GB/s and CPU per GB on each side. Skipped if iperf3 is not installed.
func BenchmarkIperf3Reference(b *testing.B) {
	bin, err := exec.LookPath("iperf3")
	if err != nil {
		b.Skip("iperf3 not on PATH: install it (apt-get install iperf3) for the reference")
	}
	for i := 0; i < b.N; i++ {
		gbps, sndCPU, rcvCPU := runIperf3(b, bin)
		b.ReportMetric(gbps, "GB/s")
		b.ReportMetric(sndCPU, "snd-cpu-s/GB")
		b.ReportMetric(rcvCPU, "rcv-cpu-s/GB")
	}
}

func runIperf3(b *testing.B, bin string) (gbps, sndCPU, rcvCPU float64) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := exec.CommandContext(ctx, bin, "-s", "-1", "-B", "127.0.0.1", "-p", port)
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	defer srv.Wait()
	var out []byte
	for try := 0; try < 50; try++ { // the server needs a moment to listen
		time.Sleep(100 * time.Millisecond)
		out, err = exec.CommandContext(ctx, bin, "-c", "127.0.0.1", "-p", port, "-t", "3", "-J").Output()
		if err == nil {
			break
		}
	}
	if err != nil {
		b.Fatalf("iperf3 client: %v", err)
	}
	var res struct {
		End struct {
			SumReceived struct {
				Bytes   float64 `json:"bytes"`
				Seconds float64 `json:"seconds"`
				BPS     float64 `json:"bits_per_second"`
			} `json:"sum_received"`
			CPU struct {
				Host   float64 `json:"host_total"`
				Remote float64 `json:"remote_total"`
			} `json:"cpu_utilization_percent"`
		} `json:"end"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		b.Fatalf("iperf3 json: %v", err)
	}
	s := res.End.SumReceived
	gb := s.Bytes / 1e9
	return s.BPS / 8 / 1e9, res.End.CPU.Host / 100 * s.Seconds / gb, res.End.CPU.Remote / 100 * s.Seconds / gb
}
