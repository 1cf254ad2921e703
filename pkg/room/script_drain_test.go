package room

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/pdlink/pdlink/pkg/poll"
)

// Script commands for planned stops and injected panics (see TestScript
// for the list): drain runs a node's Drain on its own goroutine, as the
// daemon's SIGTERM handler does, and panic arms a data-plane call to
// panic once.

// scriptDrain is a Drain running on its own goroutine.
type scriptDrain struct {
	side  scriptSide
	start time.Time
	gid   string        // the drain goroutine's id, for drainsParked
	done  chan struct{} // closed after the drain's answer was traced
	stop  context.CancelFunc
}

// drainDefaults are the plan's durations unless the script says
// otherwise: the daemon's defaults scaled to the test's timeouts.
const (
	drainDefaultDeadline = 500 * time.Millisecond
	drainDefaultGrace    = 300 * time.Millisecond
	drainDefaultOverrun  = 700 * time.Millisecond
)

// cmdDrain: drain <side> [deadline=D] [grace=G] [cap=C], each a duration
// from now on the node's clock (cap: deadline+700ms).
func (e *scriptEnv) cmdDrain(a scriptArgs) error {
	if len(a.pos) != 1 {
		return fmt.Errorf("drain prefill|decode [deadline=D] [grace=G] [cap=C]")
	}
	s, err := parseSide(a.pos[0])
	if err != nil {
		return err
	}
	durArg := func(name string, def time.Duration) (time.Duration, error) {
		v, ok := a.kv[name]
		if !ok {
			return def, nil
		}
		return time.ParseDuration(v)
	}
	deadline, err := durArg("deadline", drainDefaultDeadline)
	if err != nil {
		return err
	}
	grace, err := durArg("grace", drainDefaultGrace)
	if err != nil {
		return err
	}
	capAfter, err := durArg("cap", deadline+drainDefaultOverrun)
	if err != nil {
		return err
	}
	c, err := e.node(s)
	if err != nil {
		return err
	}
	if e.drains[s] != nil {
		return fmt.Errorf("%v is draining already", s)
	}
	now := e.clk.Now()
	plan := DrainPlan{Deadline: now.Add(deadline), TerminalGrace: grace, Cap: now.Add(capAfter)}
	ctx, stop := context.WithCancel(context.Background())
	d := &scriptDrain{side: s, start: now, done: make(chan struct{}), stop: stop}
	started := make(chan struct{})
	e.drains[s] = d
	go func() {
		d.gid = goroutineID()
		close(started)
		rep := c.Drain(ctx, plan)
		e.logf("drain on %v returned at +%v: ended=%d failed=%d invisible=%d unacked=%d capped=%v",
			s, e.clk.Now().Sub(d.start), rep.Ended, rep.Failed, rep.Invisible, rep.UnackedNotices, rep.Capped)
		close(d.done)
	}()
	<-started
	e.settle()
	return nil
}

// stopDrains ends the drains a script left running (the end of the
// script: their goroutines must not outlive it).
func (e *scriptEnv) stopDrains() {
	for _, d := range e.drains {
		if d == nil {
			continue
		}
		d.stop()
		select {
		case <-d.done:
		case <-time.After(quietLimit):
			e.t.Errorf("a drain on %v did not return within %v of its context ending", d.side, quietLimit)
		}
	}
}

// drainsParked reports whether every running drain waits on a channel.
// A drain is a goroutine of the node that no queue or call count shows:
// it wakes on the node's clock, its subscription and the link's ACKs,
// and then steps the table (the deadline's failures) or sends GOODBYE.
// The harness must not move on while it does, or its effects would land
// in a later command's trace depending on the scheduler, so quiet asks
// the runtime what the drain goroutine is doing.
func (e *scriptEnv) drainsParked() bool {
	var ids []string
	for _, d := range e.drains {
		if d == nil {
			continue
		}
		select {
		case <-d.done:
			continue
		default:
		}
		ids = append(ids, d.gid)
	}
	if len(ids) == 0 {
		return true
	}
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for _, id := range ids {
		head := []byte("goroutine " + id + " [")
		i := bytes.Index(buf, head)
		if i < 0 {
			return false // exiting: done is closed next
		}
		status := buf[i+len(head):]
		status = status[:bytes.IndexAny(status, ",]")]
		switch string(status) {
		case "select", "chan receive", "chan send":
		default:
			return false
		}
	}
	return true
}

// cmdPanic: panic fence|bind on <side> [room] [times=N] makes the side's
// data plane panic in that call (for that room, or any) the next N times
// (1). Only calls a node worker makes: a panic in Expect or Forget is
// raised on the scheduler's call (a harness goroutine) and would end the
// test binary.
func (e *scriptEnv) cmdPanic(a scriptArgs) error {
	if len(a.pos) < 1 {
		return fmt.Errorf("panic fence|bind on <side> [room] [times=N]")
	}
	switch a.pos[0] {
	case "fence", "bind":
	default:
		return fmt.Errorf("panic %q: want fence or bind", a.pos[0])
	}
	s, err := a.side()
	if err != nil {
		return err
	}
	var room uint64
	if len(a.pos) > 1 {
		r, err := a.room(1)
		if err != nil {
			return err
		}
		room = uint64(r)
	}
	times, err := a.intArg("times", 1)
	if err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.panics[s] == nil {
		e.panics[s] = map[string]int{}
	}
	e.panics[s][fmt.Sprintf("%s/%d", a.pos[0], room)] += times
	return nil
}

// maybePanic panics if the script armed a panic for this call of the
// side's data plane, after tracing it.
func (e *scriptEnv) maybePanic(s scriptSide, call string, key poll.Key) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, armed := range []string{fmt.Sprintf("%s/%d", call, key.Room), call + "/0"} {
		if e.panics[s][armed] > 0 {
			e.panics[s][armed]--
			e.appendLocked(fmt.Sprintf("%v dp: %s %s panics", s, call, e.keyLocked(key)))
			panic(fmt.Sprintf("script: %s %d panics", call, key.Room))
		}
	}
}
