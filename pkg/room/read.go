package room

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pdlink/pdlink/pkg/poll"
)

// Transition is one visible state change of a room, for Watch streams.
// A room's move to Failed is published once its worker is fenced (I9).
type Transition struct {
	Key      poll.Key
	From, To poll.State
	Reason   poll.Reason
	// PeerReason is the peer's reason on a move to Failed it caused.
	PeerReason poll.Reason
	// PrefixLen is the room's Status.PrefixLen when it moved.
	PrefixLen uint32
	At        time.Time
}

// RoomEnd is a room reaching its terminal state, as the node's Ended hook
// hears it: once per room, as the table moves it to Success or Failed (a
// Failed room before its fence makes the failure visible to Poll and
// Watch), whether or not any subscriber keeps up.
type RoomEnd struct {
	Key poll.Key
	To  poll.State // Success or Failed
	// Reason is the failure reason (Failed only).
	Reason poll.Reason
	// Life is the time from the room's open to its terminal state.
	Life time.Duration
	// Transfer is, on Success, the time from the room's first KV byte to
	// Success; 0 on Failed.
	Transfer time.Duration
}

// Status is what a scheduler may see of a room: the table's poll.Status
// and, on prefill, decode's prefix.
type Status struct {
	poll.Status
	// PrefixLen is how many leading positions decode already holds, once
	// every decode rank's METADATA is in (prefill; 0 on decode): the
	// scheduler's Sends may start there (prefix.go).
	PrefixLen uint32
}

// Subscription receives a node's transitions. It never blocks the node: a
// transition that does not fit the buffer is dropped and counted, and the
// reader re-syncs with Poll (the Watch stream's "missed" event).
type Subscription struct {
	c       *core
	ch      chan Transition
	dropped atomic.Uint64
	once    sync.Once
}

// C returns the transitions. It is closed by Close.
func (s *Subscription) C() <-chan Transition { return s.ch }

// Dropped returns how many transitions did not fit the buffer so far.
func (s *Subscription) Dropped() uint64 { return s.dropped.Load() }

// Close stops the subscription and closes C.
func (s *Subscription) Close() {
	s.once.Do(func() {
		s.c.subMu.Lock()
		delete(s.c.subs, s)
		close(s.ch)
		s.c.subMu.Unlock()
	})
}

func (c *core) subscribe(buf int) *Subscription {
	if buf <= 0 {
		buf = c.cfg.SubscriberBuffer
	}
	s := &Subscription{c: c, ch: make(chan Transition, buf)}
	c.subMu.Lock()
	c.subs[s] = struct{}{}
	c.subMu.Unlock()
	return s
}

// end hands a room's terminal transition to the Ended hook. It is called
// inside withTable (takeLocked), on the owner goroutine while it runs, so
// the hook must be quick and must never block nor call the node.
func (c *core) end(e poll.Effect) {
	if c.ended == nil {
		return
	}
	re := RoomEnd{Key: e.Key, To: e.To, Reason: e.Reason, Life: time.Duration(e.At - e.Opened)}
	if e.To == poll.Success && e.From == poll.Transferring {
		re.Transfer = time.Duration(e.At - e.Entered)
	}
	c.ended(re)
}

// publish is called inside withTable (takeLocked), on the owner goroutine
// while it runs, so it must never block.
func (c *core) publish(tr Transition) {
	if c.publishHook != nil {
		c.publishHook(tr)
	}
	c.subMu.Lock()
	defer c.subMu.Unlock()
	for s := range c.subs {
		select {
		case s.ch <- tr:
		default:
			s.dropped.Add(1)
			c.lk.CountWatchDropped()
		}
	}
}

// Poll reports, for each room id, the state the scheduler may see (I9), or
// poll.StateNone for a room not in the table; it appends to out[:0].
func (c *core) Poll(ids []poll.RoomID, out []poll.State) []poll.State {
	c.exec(func() { c.withTable(func() { out = c.t.Poll(ids, out) }) })
	return out
}

// PollStatus is Poll with each room's nonce, decode's prefix and, once
// Failed is visible, its reasons (see poll.Table.PollStatus); it appends
// to out[:0].
func (c *core) PollStatus(ids []poll.RoomID, out []Status) []Status {
	c.exec(func() { c.withTable(func() { out = c.pollStatusLocked(ids, out[:0]) }) })
	return out
}

func (c *core) pollStatusLocked(ids []poll.RoomID, out []Status) []Status {
	var one [1]poll.Status
	for i := range ids {
		st := c.t.PollStatus(ids[i:i+1], one[:0])[0]
		s := Status{Status: st}
		if st.State != poll.StateNone {
			s.PrefixLen = c.prefixOfLocked(poll.Key{Room: ids[i], Nonce: st.Nonce})
		}
		out = append(out, s)
	}
	return out
}

// Get returns a copy of the room with this id (poll.ErrNotFound if none).
func (c *core) Get(id poll.RoomID) (poll.RoomInfo, error) {
	var info poll.RoomInfo
	var err error
	c.exec(func() { c.withTable(func() { info, err = c.t.Get(id) }) })
	return info, err
}

// List returns a page of rooms (see poll.Table.List).
func (c *core) List(f poll.Filter, pageToken string, limit int) ([]poll.RoomInfo, string, error) {
	var infos []poll.RoomInfo
	var next string
	var err error
	c.exec(func() { c.withTable(func() { infos, next, err = c.t.List(c.now(), f, pageToken, limit) }) })
	return infos, next, err
}

// Stats returns the room table's snapshot for metrics.
func (c *core) Stats() poll.Stats {
	var st poll.Stats
	c.exec(func() { c.withTable(func() { st = c.t.Stats(c.now()) }) })
	return st
}

// Clear removes terminal rooms; errs[i] is the result for ids[i] (errs
// must be at least as long as ids). Cleared rooms are forgotten by the
// data plane.
func (c *core) Clear(ids []poll.RoomID, errs []error) {
	c.apply(func() { c.t.ClearBatch(c.now(), ids, errs) })
}

// Shutdown fails every live room with reason shutdown while the sockets
// still serve, then waits until every frame about a room is acknowledged
// or abandoned, or ctx ends; then it says goodbye to the peers and waits,
// within the same ctx, for their ACKs, so they forget this node instead of
// counting it lost (goodbye.go). Call it (or Drain, drain.go, which the
// daemons use: it adds a deadline, a terminal grace and a cap) before
// Close, so the peer hears of each room (R8) instead of waiting out its
// own deadline: Close alone sends each notice once and shuts the socket,
// and ZeroMQ may drop what was queued.
func (c *core) Shutdown(ctx context.Context) {
	_ = c.step(poll.Event{Kind: poll.EvShutdown})
	c.lk.AwaitRoomFramesAcked(ctx)
	// Even with the drain spent, one GOODBYE goes out.
	c.lk.SayGoodbye(ctx)
}

// WallTime converts a table time (RoomInfo.CreatedAt, Deadline, history)
// to wall time.
func (c *core) WallTime(ns int64) time.Time { return c.wall(ns) }

// Instance returns this node's instance id and epoch.
func (c *core) Instance() (string, uint64) { return c.cfg.Instance, c.cfg.Epoch }

// checkInvariants runs the table's invariant check (tests).
func (c *core) checkInvariants() error {
	var err error
	c.exec(func() { c.withTable(func() { err = c.t.CheckInvariants() }) })
	return err
}
