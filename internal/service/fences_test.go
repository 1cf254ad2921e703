package service

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/poll"
)

// The adapters' fence never blocks its caller (a conn socket reader or the tick loop):
// start returns at once with "not done" while the blocking fence runs elsewhere, a second
// request for the same room while it runs starts no second goroutine, and Fenced is
// reported once, after the blocking fence returned.
func TestFenceRunnerDoesNotBlockAndRunsOneFencePerRoom(t *testing.T) {
	var f fenceRunner
	key := poll.Key{Room: 1, Nonce: 2}
	release := make(chan struct{})
	var runs, reports atomic.Int32
	var mu sync.Mutex
	var reported []poll.Key
	fence := func() { runs.Add(1); <-release }
	fenced := func(k poll.Key) {
		reports.Add(1)
		mu.Lock()
		reported = append(reported, k)
		mu.Unlock()
	}
	returned := make(chan bool, 2)
	go func() {
		returned <- f.start(key, fence, fenced)
		returned <- f.start(key, fence, fenced)
	}()
	for i := range 2 {
		select {
		case done := <-returned:
			if done {
				t.Fatalf("start %d answered done while the fence is blocked", i)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("start %d blocked with the fence", i)
		}
	}
	if n := reports.Load(); n != 0 {
		t.Fatalf("Fenced reported %d times before the fence returned", n)
	}
	close(release)
	f.wait()
	if runs.Load() != 1 || reports.Load() != 1 || reported[0] != key {
		t.Fatalf("fence ran %d times, Fenced %d times (%v); want once each for %v", runs.Load(), reports.Load(), reported, key)
	}
}
