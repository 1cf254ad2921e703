package chaos

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/pdlink/pdlink/internal/testbed"
)

var (
	long   = flag.Bool("chaos.long", os.Getenv("PDLINK_CHAOS_LONG") != "", "run the long version of the suite (also PDLINK_CHAOS_LONG=1)")
	binDir string
)

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := testbed.BuildDaemons("pdlink-chaos-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	start := time.Now()
	code := m.Run()
	printSummary(time.Since(start))
	os.RemoveAll(dir)
	os.Exit(code)
}

func bin(name string) string { return filepath.Join(binDir, name) }

// seed is the workload seed: PDLINK_CHAOS_SEED, or the clock.
func seed() uint64 {
	if s := os.Getenv("PDLINK_CHAOS_SEED"); s != "" {
		if v, err := strconv.ParseUint(s, 10, 64); err == nil && v != 0 {
			return v
		}
	}
	return uint64(time.Now().UnixNano())
}

// row is one scenario's line in the closing table.
type row struct {
	Scenario   string
	Rooms      int
	Outcomes   string
	Worst      time.Duration
	Bound      time.Duration
	Leaks      string
	Passed     bool
	Additional string
}

var (
	rowsMu sync.Mutex
	rows   []row
)

func addRow(r row) {
	rowsMu.Lock()
	rows = append(rows, r)
	rowsMu.Unlock()
}

func printSummary(total time.Duration) {
	rowsMu.Lock()
	defer rowsMu.Unlock()
	if len(rows) == 0 {
		return
	}
	mode := "short"
	if *long {
		mode = "long"
	}
	fmt.Printf("\nchaos suite (%s) in %v:\n", mode, total.Round(time.Second))
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "scenario\trooms\tworst/bound\tleaks\tresult\toutcomes")
	for _, r := range rows {
		res := "ok"
		if !r.Passed {
			res = "FAIL"
		}
		fmt.Fprintf(w, "%s\t%d\t%v/%v\t%s\t%s\t%s\n", r.Scenario, r.Rooms, r.Worst.Round(10*time.Millisecond), r.Bound, r.Leaks, res, r.Outcomes)
	}
	w.Flush()
}
