package testbed

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pdlink/pdlink/internal/sim"
)

// BackgroundBound is the most requests a background workload starts: it
// keeps the request loop bounded should a test never stop it (ctx and the
// test's cleanup stop it first).
const BackgroundBound = 100000

// Background is a workload that runs until the test stops it, so rooms are
// in flight whenever the test's fault comes, however fast the machine runs
// them. A fixed number of requests can all end between "a fifth of them
// ended" and the test's next look at the daemons (seen in CI: 200 rooms
// gone before the first metric scrape, and the fault then hit no room).
type Background struct {
	// Warm is closed once warm requests ended: the daemons are past their
	// first rooms and the workload is in its steady state.
	Warm <-chan struct{}

	stop   chan struct{}
	once   sync.Once
	report chan *sim.Report
	ended  atomic.Int64
}

// StartBackground runs w on s (w.Requests, Progress and Stop are set here)
// until Stop, ctx or the end of t.
func StartBackground(ctx context.Context, t testing.TB, s *sim.Sim, w sim.Config, warm int) *Background {
	t.Helper()
	warmed := make(chan struct{})
	b := &Background{Warm: warmed, stop: make(chan struct{}), report: make(chan *sim.Report, 1)}
	var warmOnce sync.Once
	w.Requests, w.Stop = BackgroundBound, b.stop
	w.Progress = func(done, _ int) {
		b.ended.Add(1)
		if done >= warm {
			warmOnce.Do(func() { close(warmed) })
		}
	}
	go func() {
		rep, err := s.Run(ctx, w)
		if err != nil {
			t.Errorf("sim: %v", err)
		}
		b.report <- rep
	}()
	t.Cleanup(func() {
		b.Stop()
		// The run's goroutines use t: wait for them before t ends.
		b.Report()
	})
	return b
}

// Ended is how many requests ended so far: a test that needs rooms to run
// after some moment (a reload, a heal) reads it then and waits for more.
func (b *Background) Ended() int { return int(b.ended.Load()) }

// Stop makes the workload start no more requests; those in flight run to
// their end. It does not wait.
func (b *Background) Stop() { b.once.Do(func() { close(b.stop) }) }

// Report stops the workload and returns its report once every request
// ended (nil if the run failed). Later calls return the same report.
func (b *Background) Report() *sim.Report {
	b.Stop()
	rep := <-b.report
	b.report <- rep
	return rep
}
