package main

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/pdlink/pdlink/internal/sim"
	"github.com/pdlink/pdlink/internal/testbed"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if daemonsDir != "" {
		os.RemoveAll(daemonsDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}

var (
	buildOnce  sync.Once
	daemonsDir string
	daemonsErr error
)

// daemons builds prefilld and decoded once for the package's tests and
// returns their directory.
func daemons(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() { daemonsDir, daemonsErr = testbed.BuildDaemons("pdctl-test-bin-") })
	if daemonsErr != nil {
		t.Fatal(daemonsErr)
	}
	return daemonsDir
}

// `pdctl -help` and `pdctl rooms -help` print the help like -h, instead of
// "unknown shorthand flag: 'e' in -elp".
func TestSingleDashHelpPrintsTheHelpOfEachCommand(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-help"}, "pdlink operator and load tool"},
		{[]string{"rooms", "-help"}, "--min-age"},
		{[]string{"watch", "-help"}, "--for"},
		{[]string{"rooms", "-h"}, "--min-age"},
	} {
		root := newRootCommand()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(c.args)
		if err := root.Execute(); err != nil {
			t.Errorf("pdctl %v: %v", c.args, err)
			continue
		}
		if !strings.Contains(out.String(), "Usage:") || !strings.Contains(out.String(), c.want) {
			t.Errorf("pdctl %v printed %q, want its help", c.args, out.String())
		}
	}
}

// `pdctl demo --prefix-fraction 0.5 --layer-wise` checks every room byte
// for byte: the half of each room's pages decode holds stay untouched (a
// corrupt room otherwise), every other page arrives through a Send per
// layer; its report shows prefill sending only the pages decode wrote.
func TestDemoVerifiesEveryByteWithPrefixSkipAndLayerWise(t *testing.T) {
	bin, shm := daemons(t), t.TempDir()
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"demo", "--bin-dir", bin, "--shm-dir", shm, "--requests", "12", "--concurrency", "4",
		"--layers", "2", "--bytes-per-token", "1024", "--pages", "256", "--min-tokens", "64", "--max-tokens", "512",
		"--prefix-fraction", "0.5", "--layer-wise"})
	if err := root.Execute(); err != nil {
		t.Fatalf("pdctl demo: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "verified:     12 rooms byte for byte, 0 corrupt") {
		t.Fatalf("pdctl demo did not verify every room:\n%s", out.String())
	}
	pages := regexp.MustCompile(`pages: +prefill sent (\d+) \(([0-9.]+) GB\), decode wrote (\d+) \(([0-9.]+) GB\); (\d+) prefix pages`).FindStringSubmatch(out.String())
	if pages == nil || pages[1] != pages[3] || pages[2] != pages[4] || pages[1] == "0" || pages[5] == "0" {
		t.Fatalf("pdctl demo's pages line does not show prefill sending just what decode wrote beside a prefix (got %q):\n%s", pages, out.String())
	}
	if !strings.Contains(out.String(), "1 kv heads x 128 x 2 B") {
		t.Fatalf("pdctl demo did not describe its heads (256-byte rows of bf16 heads of 128):\n%s", out.String())
	}
	// The regions lived in the demo's private --region-dir under
	// --shm-dir, which goes with them.
	if left, err := os.ReadDir(shm); err != nil || len(left) != 0 {
		t.Fatalf("after the demo --shm-dir holds %v (err %v), want nothing", left, err)
	}
}

// TestHeadFlagsThatDoNotFitTheRowAreRefused: --head-dim and --dtype-bytes given must split
// each buffer's token row into whole heads; left at their defaults they leave a row they do
// not fit opaque.
func TestHeadFlagsThatDoNotFitTheRowAreRefused(t *testing.T) {
	root := newRootCommand()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"demo", "--bin-dir", t.TempDir(), "--layers", "2", "--bytes-per-token", "1024", "--head-dim", "96"})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "not whole heads of --head-dim 96") {
		t.Fatalf("pdctl demo --head-dim 96 over 256-byte rows: %v, want the misfit named", err)
	}
	l := sim.TestLayout()
	l.BytesPerToken = 256
	cmd := newDemoCommand()
	if err := fitHeads(cmd, &l); err != nil || l.HeadDim != 0 || describeHeads(l, 1) != "opaque" {
		t.Fatalf("default heads over 64-byte rows: %v, head-dim %d, want an opaque layout", err, l.HeadDim)
	}
}

// `pdctl demo --prefill-tp 2 --decode-tp 2` runs one scheduler per rank on
// each side, verifies every rank's bytes and reports each rank's rooms/s
// and GB/s; with --mla, 2 -> 4 verifies every byte too (each decode rank
// fed whole pages by one prefill rank), and so does MHA 2 -> 4 (each
// decode rank takes half of one prefill rank's heads).
func TestDemoRunsOneSchedulerPerRankAndReportsEachRank(t *testing.T) {
	bin := daemons(t)
	demo := func(args ...string) (string, error) {
		root := newRootCommand()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs(append([]string{"demo", "--bin-dir", bin, "--shm-dir", t.TempDir(), "--requests", "12", "--concurrency", "4",
			"--layers", "2", "--bytes-per-token", "4096", "--pages", "128", "--min-tokens", "64", "--max-tokens", "512"}, args...))
		err := root.Execute()
		return out.String(), err
	}
	out, err := demo("--prefill-tp", "2", "--decode-tp", "2")
	if err != nil {
		t.Fatalf("pdctl demo --prefill-tp 2 --decode-tp 2: %v\n%s", err, out)
	}
	for _, want := range []string{"verified:     12 rooms byte for byte, 0 corrupt", "mha tp 2 -> 2", "prefill  per rank  0: ", " | 1: ", "decode   per rank  0: "} {
		if !strings.Contains(out, want) {
			t.Fatalf("pdctl demo at tp 2 -> 2 printed no %q:\n%s", want, out)
		}
	}
	out, err = demo("--prefill-tp", "2", "--decode-tp", "4", "--mla")
	if err != nil || !strings.Contains(out, "verified:     12 rooms byte for byte, 0 corrupt") || !strings.Contains(out, "mla tp 2 -> 4") {
		t.Fatalf("pdctl demo --mla at tp 2 -> 4: %v\n%s", err, out)
	}
	out, err = demo("--prefill-tp", "2", "--decode-tp", "4")
	if err != nil || !strings.Contains(out, "verified:     12 rooms byte for byte, 0 corrupt") || !strings.Contains(out, "mha tp 2 -> 4") {
		t.Fatalf("pdctl demo at tp 2 -> 4 (head slices): %v\n%s", err, out)
	}
}
