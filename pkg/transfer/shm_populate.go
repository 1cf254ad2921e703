//go:build linux

package transfer

import (
	"errors"
	"fmt"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// populateStepBytes is how much of a source mapping the populate worker pre-faults in one
// madvise call: at BenchmarkShmOfferMap/prefault's 1.5-6.7 GB/s a step lasts 5-22 ms,
// which is the longest Receiver.Close waits for the worker and the longest an unmap of a
// retired source is put off.
const populateStepBytes = 32 << 20

// populator pre-faults the page tables of proven prefill mappings off the connection
// goroutines, which answer an offer as soon as the file is proven and mapped: with
// MAP_POPULATE on the connection goroutine every room on the connection waited for the
// whole region (a 40 GiB region took 13-29 s here). At most one worker goroutine runs per
// Receiver (started when a job is queued, gone when none is left or the Receiver closes),
// so pre-faulting never takes more than one core from the copies. Its fields and its
// jobs' are under Receiver.pmu. A job's mapping is unmapped exactly once, by whoever lets
// go of it last: the connection goroutine that dropped it when no step runs on it,
// else the worker when that step ends, so no madvise ever runs on an unmapped range.
type populator struct {
	queue   []*populateJob // jobs with pages left, served one step each in turn
	running bool           // a worker goroutine is live
	stopped bool           // the Receiver is closing: the worker exits after its step
	// noMadvise: the kernel has no MADV_POPULATE_READ (before Linux 5.14); sources then
	// fault in on their first copy.
	noMadvise bool
	// step is populateStepBytes unless a test makes several steps of a small region.
	step int64
}

// populateJob is one source mapping being pre-faulted. Its fields are under Receiver.pmu.
type populateJob struct {
	r       *Receiver
	m       *Mapping
	next    int64 // bytes of m pre-faulted so far
	busy    bool  // the worker is in a step on m now
	dropped bool  // the connection let go of m; it is unmapped once no step runs on it
}

// populateRange pre-faults the page tables of bytes [off, off+n) of m for reading. A file
// truncated under the range fails it with EFAULT (no SIGBUS: madvise reports what an
// access would have raised), so the fault handling of the copy path stays the only one.
func populateRange(m *Mapping, off, n int64) error {
	for {
		err := unix.Madvise(m.mem[off:off+n:off+n], unix.MADV_POPULATE_READ)
		if err == unix.EINTR { // a signal to the thread, not a verdict on the pages
			continue
		}
		if err != nil {
			return fmt.Errorf("madvise populate read %s: %w", m.id.Path, err)
		}
		return nil
	}
}

// startPopulate queues m to be pre-faulted and returns its job (nil when nothing will
// pre-fault it: the Receiver is closing, or the kernel cannot). Called by a connection
// goroutine, which holds a count of r.wg, so the worker's Add never races Close's Wait.
func (r *Receiver) startPopulate(m *Mapping) *populateJob {
	p := &r.pop
	r.pmu.Lock()
	defer r.pmu.Unlock()
	if p.stopped || p.noMadvise || len(m.mem) == 0 {
		return nil
	}
	j := &populateJob{r: r, m: m}
	p.queue = append(p.queue, j)
	if !p.running {
		p.running = true
		r.wg.Add(1)
		go r.populateLoop()
	}
	return j
}

// drop lets go of j's mapping for its connection goroutine: unmapped now if no step runs
// on it, else by the worker when the step ends.
func (j *populateJob) drop() {
	r := j.r
	r.pmu.Lock()
	j.dropped = true
	busy := j.busy
	r.pmu.Unlock()
	if !busy {
		j.m.Close()
	}
}

// stopPopulate makes the worker exit after its step; Close then waits for it with r.wg.
func (r *Receiver) stopPopulate() {
	r.pmu.Lock()
	r.pop.stopped = true
	r.pmu.Unlock()
}

// populateLoop is the worker: one step of the first queued job, then that job goes to the
// back of the queue, so a second region's offer is not pre-faulted only after a 40 GiB one.
func (r *Receiver) populateLoop() {
	defer r.wg.Done()
	p := &r.pop
	for {
		r.pmu.Lock()
		for len(p.queue) > 0 && p.queue[0].dropped { // unmapped by its dropper: no step ran
			p.queue = p.queue[1:]
		}
		if p.stopped || p.noMadvise || len(p.queue) == 0 {
			p.running = false
			p.queue = nil
			r.pmu.Unlock()
			return
		}
		j := p.queue[0]
		p.queue = p.queue[1:]
		j.busy = true
		off := j.next
		n := int64(populateStepBytes)
		if p.step > 0 {
			n = p.step
		}
		n = min(n, int64(len(j.m.mem))-off)
		r.pmu.Unlock()

		err := r.populate(j.m, off, n)

		r.pmu.Lock()
		j.busy = false
		j.next += n
		dropped := j.dropped
		if errors.Is(err, unix.EINVAL) {
			p.noMadvise = true
		}
		if !dropped && err == nil && j.next < int64(len(j.m.mem)) {
			p.queue = append(p.queue, j)
		}
		r.pmu.Unlock()
		if dropped {
			j.m.Close()
		}
		switch {
		case errors.Is(err, unix.EINVAL):
			r.log.Info("same-host source pages fault in on first copy: no MADV_POPULATE_READ", zap.Error(err))
		case err != nil && !dropped:
			// A file truncated or removed under the mapping: its next chunk's stat or copy
			// fails the room, as without pre-faulting.
			r.log.Warn("same-host source pre-fault stopped", zap.String("region", j.m.id.Path), zap.Error(err))
		}
	}
}
