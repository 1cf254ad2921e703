package service

import (
	"sync"

	"github.com/pdlink/pdlink/pkg/poll"
)

// fenceRunner runs the data plane's blocking fences off the node's
// goroutines (conn never waits for a fence): one goroutine per room whose
// fence is in progress, at most, which reports Fenced when the fence
// returns. When pkg/transfer's Fence stops blocking (done bool plus an
// OnFenced callback), this goes and the adapters call it directly.
type fenceRunner struct {
	mu      sync.Mutex
	running map[poll.Key]bool
	wg      sync.WaitGroup
}

// start runs fence for key on its own goroutine, then fenced(key), unless
// a fence of key is running already (its fenced call covers this one). It
// returns false: the fence is not done yet.
func (f *fenceRunner) start(key poll.Key, fence func(), fenced func(poll.Key)) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.running[key] {
		return false
	}
	if f.running == nil {
		f.running = make(map[poll.Key]bool)
	}
	f.running[key] = true
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		fence()
		f.mu.Lock()
		delete(f.running, key)
		f.mu.Unlock()
		fenced(key)
	}()
	return false
}

// wait returns once every fence started has returned (the transfer was
// closed first, so none stays blocked).
func (f *fenceRunner) wait() { f.wg.Wait() }
