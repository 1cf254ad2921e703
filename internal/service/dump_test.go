package service

import (
	"context"
	"io"
	"net/http"
	"os"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"
)

// livePairs are the pairs the running tests started and not yet stopped: what a wait that
// timed out dumps.
var livePairs = struct {
	sync.Mutex
	m map[*pair]struct{}
}{m: map[*pair]struct{}{}}

func trackPair(t testing.TB, p *pair) {
	livePairs.Lock()
	livePairs.m[p] = struct{}{}
	livePairs.Unlock()
	t.Cleanup(func() {
		livePairs.Lock()
		delete(livePairs.m, p)
		livePairs.Unlock()
	})
}

// dumpOnTimeout logs what tells a hang from a starved machine when a wait ran out: the load
// average, every live pair's rooms as each daemon sees them (/debug/rooms), and the path of
// a file holding every goroutine's stack (kept after the test: it is what a hang is read
// from, and too long for the log).
func dumpOnTimeout(t testing.TB, what string) {
	t.Helper()
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		t.Logf("%s timed out; load average %s", what, strings.TrimSpace(string(b)))
	}
	livePairs.Lock()
	pairs := make([]*pair, 0, len(livePairs.m))
	for p := range livePairs.m {
		pairs = append(pairs, p)
	}
	livePairs.Unlock()
	for _, p := range pairs {
		t.Logf("prefilld /debug/rooms: %s", roomsForDump(p.preHTTP))
		t.Logf("decoded /debug/rooms: %s", roomsForDump(p.decHTTP))
	}
	f, err := os.CreateTemp("", "pdlink-goroutines-*.txt")
	if err != nil {
		t.Logf("no goroutine dump: %v", err)
		return
	}
	defer f.Close()
	if err := pprof.Lookup("goroutine").WriteTo(f, 2); err != nil {
		t.Logf("goroutine dump %s incomplete: %v", f.Name(), err)
		return
	}
	t.Logf("goroutines (%d) dumped to %s", pprof.Lookup("goroutine").Count(), f.Name())
}

// roomsForDump is a daemon's /debug/rooms, or why it could not be read: a dump must not
// fail or hang on a daemon that is the thing hanging.
func roomsForDump(base string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/debug/rooms", nil)
	if err != nil {
		return err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<10))
	if err != nil {
		return err.Error()
	}
	return string(b)
}
