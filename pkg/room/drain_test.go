package room

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

const (
	tDrainTimeout = 500 * time.Millisecond
	tGrace        = 300 * time.Millisecond
	tOverrun      = 700 * time.Millisecond
)

// drainRun is the prefill node's Drain running on its own goroutine;
// returnedAt is the fake clock's time right after it returned.
type drainRun struct {
	plan       DrainPlan
	done       chan struct{}
	rep        DrainReport
	returnedAt time.Time
}

func (h *harness) startDrain() *drainRun {
	h.t.Helper()
	now := h.clk.Now()
	d := &drainRun{done: make(chan struct{}), plan: DrainPlan{
		Deadline: now.Add(tDrainTimeout), TerminalGrace: tGrace, Cap: now.Add(tDrainTimeout + tOverrun)}}
	subs := func() int {
		h.pre.subMu.Lock()
		defer h.pre.subMu.Unlock()
		return len(h.pre.subs)
	}
	before := subs()
	go func() {
		defer close(d.done)
		d.rep = h.pre.Drain(context.Background(), d.plan)
		d.returnedAt = h.clk.Now()
	}()
	// The drain's first act is to subscribe: from then on it sees every
	// transition, whenever its goroutine runs.
	if !h.waitReal(5*time.Second, func() bool { return subs() > before || d.returned() }) {
		h.t.Fatal("the drain never started")
	}
	return d
}

func (d *drainRun) returned() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// caughtUp reports whether every subscriber of c, the drain's own
// included, has read every transition published so far.
func caughtUp(c *core) bool {
	c.subMu.Lock()
	defer c.subMu.Unlock()
	for s := range c.subs {
		if len(s.ch) > 0 {
			return false
		}
	}
	return true
}

// tickCaughtUp advances one tick and waits (real time) until the nodes'
// subscribers have read what it published, so the drain sees each room
// end at the virtual time it ended.
func (h *harness) tickCaughtUp() {
	h.t.Helper()
	h.advance(tTick)
	if !h.waitReal(5*time.Second, func() bool { return caughtUp(h.pre.core) && caughtUp(h.dec.core) }) {
		h.t.Fatal("the drain did not read the transitions published")
	}
}

// The issue: at the drain deadline the rooms fail with shutdown and the
// peer acknowledges the notices within milliseconds; the drain used to
// return then, and the daemon stopped serving before a scheduler polling
// every 10 ms had looked. The drain must keep its node answering until
// each room failed at the deadline has been visible for the grace, and
// only then say goodbye.
func TestRoomsFailedAtTheDrainDeadlineStayPollableForTheGrace(t *testing.T) {
	h := newHarness(t, 50)
	bound := h.open(1, 1)
	if !h.waitBound(bound, time.Second) {
		t.Fatal("room 1 never bound")
	}
	if _, err := h.pre.Open(2, 0, 0); err != nil { // decode never opens it
		t.Fatal(err)
	}
	rooms := []poll.RoomID{1, 2}
	d := h.startDrain()

	for h.clk.Now().Before(d.plan.Deadline.Add(-tTick)) {
		h.tickCaughtUp()
	}
	for _, r := range rooms {
		if st := h.preState(r); st.Terminal() {
			t.Fatalf("room %d %v before the drain deadline", r, st)
		}
	}
	if d.returned() {
		t.Fatal("the drain returned before its deadline with rooms in flight")
	}

	allFailed := func() bool {
		for _, r := range rooms {
			if h.preState(r) != poll.Failed {
				return false
			}
		}
		return true
	}
	h.tickCaughtUp() // the deadline
	// Failing them takes the drain no virtual time: wait for it before
	// time runs on.
	if !h.waitReal(5*time.Second, allFailed) {
		t.Fatal("the rooms did not turn visibly Failed at the drain deadline")
	}
	visibleAt := h.clk.Now()
	for h.clk.Now().Before(visibleAt.Add(tGrace)) {
		h.tickCaughtUp()
		if !allFailed() {
			t.Fatalf("rooms visible Failed, then not %v later", h.clk.Now().Sub(visibleAt))
		}
	}
	// The grace is over and the notices were acknowledged: the drain needs
	// no more virtual time, however late its goroutine ran meanwhile. The
	// clock stays put so a drain that measured the grace from when it got
	// to read the transitions, not from when they were published, is caught.
	if !h.waitReal(5*time.Second, d.returned) {
		t.Fatalf("the drain did not return once its rooms had been visible Failed for the grace %v", tGrace)
	}
	t.Logf("visible Failed %v after the deadline, the drain returned %v after that",
		visibleAt.Sub(d.plan.Deadline), d.returnedAt.Sub(visibleAt))
	if stayed := d.returnedAt.Sub(visibleAt); stayed < tGrace {
		t.Errorf("the drain returned %v after its rooms turned visibly Failed, want at least the grace %v", stayed, tGrace)
	}
	if d.rep.Failed != 2 || d.rep.Invisible != 0 || d.rep.UnackedNotices != 0 || d.rep.Capped {
		t.Errorf("report %+v, want 2 failed, all visible and acknowledged, not capped", d.rep)
	}
	for _, r := range rooms {
		if reason, _ := h.reason(h.pre, r); reason != poll.ReasonShutdown {
			t.Errorf("room %d failed %q, want shutdown", r, reason)
		}
	}
	if got := h.decState(1); got != poll.Failed {
		t.Errorf("decode's room 1 is %v: the shutdown notice did not reach it", got)
	}
	if _, peer := h.reason(h.dec, 1); peer != poll.ReasonShutdown {
		t.Errorf("decode's room 1 peer reason %q, want shutdown", peer)
	}
	if g := h.dec.Counters().PeerGoodbyes; g != 1 {
		t.Errorf("decode counted %d goodbyes, want 1 after the grace", g)
	}
}

// stuckFenceDP is a prefill data plane whose fence never completes: Fence
// answers not done and Fenced never follows, a worker that never lets go
// of its room.
type stuckFenceDP struct {
	*fakeDP
	entered chan poll.Key
}

func (d *stuckFenceDP) Fence(k poll.Key) bool {
	d.entered <- k
	return false
}

// A fence that never completes keeps its room's Failed invisible (I9),
// and must not keep the drain past its cap: the old drain stepped the
// shutdown on its own goroutine and waited in the fence for good.
func TestDrainReturnsByItsCapWhenAFenceNeverCompletes(t *testing.T) {
	stuck := &stuckFenceDP{entered: make(chan poll.Key, 8)}
	h := newHarnessWith(t, 51, options{pre: func(c *PrefillConfig) {
		stuck.fakeDP = c.DataPlane.(*fakeDP)
		c.DataPlane = stuck
	}})
	key := h.open(1, 1)
	if !h.waitBound(key, time.Second) {
		t.Fatal("room 1 never bound")
	}
	d := h.startDrain()
	for h.clk.Now().Before(d.plan.Cap) {
		if d.returned() {
			break
		}
		h.advance(tTick)
	}
	select {
	case k := <-stuck.entered:
		if k != key {
			t.Fatalf("fence of %v, want %v", k, key)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the drain never fenced the room")
	}
	// The fake clock stands at the cap: the drain returns without more.
	if !h.waitReal(10*time.Second, d.returned) {
		t.Fatal("the drain did not return at its cap with a fence that never completes")
	}
	if d.rep.Failed != 1 || d.rep.Invisible != 1 || !d.rep.Capped {
		t.Errorf("report %+v, want 1 failed and still invisible, capped", d.rep)
	}
	if st := h.preState(1); st == poll.Failed {
		t.Errorf("room 1 visible Failed with its fence unfinished (I9)")
	}
}

// stallAborts is a Transport whose listeners have no room for an ABORT
// once armed, until released: a link whose send queue is full. Like zmtp,
// a send waits for room at most until its ctx is done (the link's never
// waits: conn.Transport).
type stallAborts struct {
	conn.Transport
	armed   atomic.Bool
	release chan struct{}
	held    atomic.Int64
}

func (s *stallAborts) Listen(ctx context.Context, addr string) (conn.Listener, error) {
	l, err := s.Transport.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return stallingListener{Listener: l, s: s}, nil
}

type stallingListener struct {
	conn.Listener
	s *stallAborts
}

func (l stallingListener) Send(ctx context.Context, route conn.Route, frame []byte) error {
	if l.s.armed.Load() && isFrame(conn.FrameAbort)(frame) {
		l.s.held.Add(1)
		select {
		case <-l.s.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return l.Listener.Send(ctx, route, frame)
}

// At the drain deadline every live room fails at once (100k of them on a
// busy daemon), and each room's Failed turns visible as its fence is
// done. The fences must not wait behind the notices: a notice may find
// the link's send queue full, and with one room's notice sent before the
// next room's fence only the first rooms were visible by the drain's cap.
// Nor may the owner wait on the full queue: Poll runs on it.
func TestRoomsFailedAtTheDrainDeadlineTurnVisibleWhileTheirNoticesWait(t *testing.T) {
	stall := &stallAborts{release: make(chan struct{})}
	h := newHarnessWith(t, 52, options{pre: func(c *PrefillConfig) {
		stall.Transport = c.Transport
		c.Transport = stall
	}})
	rooms := []poll.RoomID{1, 2, 3}
	for _, r := range rooms {
		if k := h.open(r, 1); !h.waitBound(k, time.Second) {
			t.Fatalf("room %d never bound", r)
		}
	}
	stall.armed.Store(true)
	released := false
	release := func() {
		if !released {
			released = true
			close(stall.release)
		}
	}
	defer release()

	failed, performed := h.pre.failLive()
	if len(failed) != len(rooms) {
		t.Fatalf("%d rooms failed at the deadline, want %d", len(failed), len(rooms))
	}
	allVisible := func() bool {
		for _, st := range h.pre.Poll(rooms, nil) {
			if st != poll.Failed {
				return false
			}
		}
		return true
	}
	if !h.waitReal(5*time.Second, allVisible) {
		t.Fatalf("rooms %v with the first notice held (%d held): the fences waited behind the notices",
			h.pre.Poll(rooms, nil), stall.held.Load())
	}
	if !h.waitReal(5*time.Second, func() bool { return stall.held.Load() > 0 }) {
		t.Fatal("no notice reached the link: the test proves nothing")
	}
	// pdlink_frames_unsent_total: what the full queue refused is counted.
	if n := h.pre.Counters().SendErrors; n == 0 {
		t.Errorf("%d notices refused by the full queue, SendErrors %d", stall.held.Load(), n)
	}
	release()
	if !h.waitReal(5*time.Second, func() bool {
		select {
		case <-performed:
			return true
		default:
			return false
		}
	}) {
		t.Fatal("the notices were not all sent once the link let them go")
	}
	for _, r := range rooms {
		if _, ok := h.until(tBound, func() bool { return h.decState(r) == poll.Failed }); !ok {
			t.Errorf("decode's room %d is %v: its shutdown notice did not reach it", r, h.decState(r))
		}
	}
}

// BenchmarkDrainDeadlineFailsLiveRooms measures the drain's deadline step on
// prefill with n live rooms bound to decode: failLive's shutdown step, then
// each room's fence and notice to decode. It reports when every room was
// visible Failed (visible-ms, what the drain cap has to cover; polled
// every 2 ms), when the effects were all performed (performed-ms) and when
// decode had acknowledged every notice (acked-ms, decode's work included:
// it runs in this process on the same cores). The fake data plane fences
// at once, so this is the nodes' own cost per room.
func BenchmarkDrainDeadlineFailsLiveRooms(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("rooms=%d", n), func(b *testing.B) {
			var visible, performedAt, acked time.Duration
			for range b.N {
				b.StopTimer()
				h := newHarness(b, 60)
				ids := make([]poll.RoomID, n)
				for i := range ids {
					ids[i] = poll.RoomID(i + 1)
					h.open(ids[i], 1)
					if i%1000 == 999 {
						h.settle() // under the in-memory queue's bound
					}
				}
				h.settle()
				for i, st := range h.pre.Poll(ids, nil) {
					if st != poll.WaitingForInput {
						b.Fatalf("room %d is %v before the drain, want WaitingForInput", ids[i], st)
					}
				}
				allFailed := func() bool {
					for _, st := range h.pre.Poll(ids, nil) {
						if st != poll.Failed {
							return false
						}
					}
					return true
				}
				b.StartTimer()
				start := time.Now()
				failed, performed := h.pre.failLive()
				for !allFailed() {
					if time.Since(start) > time.Minute {
						b.Fatal("the rooms did not turn visible Failed within a minute")
					}
					// The poll interval is the measurement's resolution.
					time.Sleep(2 * time.Millisecond)
				}
				visible += time.Since(start)
				<-performed
				performedAt += time.Since(start)
				b.StopTimer()
				if len(failed) != n {
					b.Fatalf("%d rooms failed, want %d", len(failed), n)
				}
				// Retransmits (of notices the in-memory queue dropped) need
				// virtual time.
				if _, ok := h.until(tBound, func() bool { return h.pre.lk.UnackedRoomFrames() == 0 }); !ok {
					b.Fatalf("decode did not acknowledge every notice: %d unacknowledged", h.pre.lk.UnackedRoomFrames())
				}
				acked += time.Since(start)
				h.close()
			}
			per := func(d time.Duration) float64 { return float64(d.Milliseconds()) / float64(b.N) }
			b.ReportMetric(per(visible), "visible-ms")
			b.ReportMetric(per(performedAt), "performed-ms")
			b.ReportMetric(per(acked), "acked-ms")
		})
	}
}

// Found through SGLang's kill test: prefilld SIGTERMed after its decode peer
// was SIGKILLed waited the whole --drain-timeout with nothing live. A room
// aborted just after the kill sent its notice to the dead peer; once the
// peer was declared lost that notice could never be acknowledged, and the
// drain waited for the ack until its cap. A lost peer acknowledges nothing:
// the drain must not wait for it.
func TestDrainAfterThePeerIsLostDoesNotWaitForItsAcks(t *testing.T) {
	// lostFirst: the peer is declared lost before the drain starts;
	// otherwise during it, with nothing else happening (the drain must
	// wake up for it).
	for _, lostFirst := range []bool{true, false} {
		t.Run(map[bool]string{true: "lost-before", false: "lost-during"}[lostFirst], func(t *testing.T) {
			h := newHarness(t, 52)
			k1, k2 := h.open(1, 1), h.open(2, 1)
			h.waitBound(k1, time.Second)
			h.waitBound(k2, time.Second)
			h.dec.kill()
			defer func() { h.dec = nil }() // killed already
			for _, r := range []poll.RoomID{1, 2} {
				if err := h.pre.Abort(context.Background(), r, ""); err != nil {
					t.Fatal(err)
				}
			}
			if _, ok := h.until(time.Second, func() bool { return h.preState(1) == poll.Failed && h.preState(2) == poll.Failed }); !ok {
				t.Fatalf("aborted rooms %v %v", h.preState(1), h.preState(2))
			}
			lostBy := h.clk.Now().Add(tHeartbeat*tMisses + 2*tHeartbeat)
			if lostFirst {
				if _, ok := h.until(lostBy.Sub(h.clk.Now()), func() bool { return h.pre.Counters().PeersLost == 1 }); !ok {
					t.Fatal("decode never declared lost")
				}
			}
			unacked := h.pre.lk.UnackedRoomFrames()
			if unacked == 0 {
				t.Fatal("the aborts' notices to the killed decode were acknowledged: the test needs them outstanding")
			}
			d := h.startDrain()
			start := h.clk.Now()
			// Only the peer's loss may need virtual time: once it is lost
			// (before, or by ticking until it is), the drain must return
			// with the clock standing still, not at its cap.
			for h.pre.Counters().PeersLost == 0 && h.clk.Now().Before(lostBy) {
				h.tickCaughtUp()
			}
			if h.pre.Counters().PeersLost != 1 {
				t.Fatal("decode never declared lost")
			}
			lostAt := h.clk.Now()
			if !h.waitReal(5*time.Second, d.returned) {
				t.Fatalf("the drain did not return once its only peer was lost (%v after it started; cap at %v): it waits for a lost peer's acks",
					lostAt.Sub(start), d.plan.Cap.Sub(start))
			}
			t.Logf("%d notices to the killed peer; the drain returned %v after it started (report %+v)", unacked, d.returnedAt.Sub(start), d.rep)
			if d.rep.Capped {
				t.Errorf("report %+v: capped", d.rep)
			}
		})
	}
}
