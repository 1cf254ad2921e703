package room

import (
	"sync"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

// The ACK is the owner's effect (docs/history/room-PLAN.md step 3): a reader hands a room frame
// to the owner with a token and goes back to its socket; the owner answers
// through Link.Ack after the step's effects. These tests hold prefill's
// owner inside the step of a METADATA (roomFrameHook runs on the owner)
// and look at what the link does meanwhile.

// heldOwner holds prefill's owner in the step of the first METADATA and
// records every room frame the owner steps.
type heldOwner struct {
	mu      sync.Mutex
	got     []delivery
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newHeldOwner() *heldOwner {
	return &heldOwner{entered: make(chan struct{}), release: make(chan struct{})}
}

func (o *heldOwner) hook(peer poll.PeerID, seq uint64, ft conn.FrameType) {
	o.mu.Lock()
	o.got = append(o.got, delivery{peer, seq, ft})
	first := len(o.got) == 1
	o.mu.Unlock()
	if first {
		close(o.entered)
		<-o.release
	}
}

func (o *heldOwner) unblock() { o.once.Do(func() { close(o.release) }) }

func (o *heldOwner) deliveries() []delivery {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]delivery(nil), o.got...)
}

// holdPrefillOwner starts a harness whose prefill owner is held in the
// step of room 1's METADATA once it arrives; rooms 1..rooms are open on
// prefill (the opens are owner calls: they go first).
func holdPrefillOwner(t *testing.T, rooms poll.RoomID, tweak func(*PrefillConfig)) (*harness, *heldOwner) {
	t.Helper()
	held := newHeldOwner()
	h := newHarnessWith(t, 47, options{pre: func(c *PrefillConfig) {
		c.roomFrameHook = held.hook
		if tweak != nil {
			tweak(c)
		}
	}})
	t.Cleanup(held.unblock) // before the harness closes the nodes
	for r := poll.RoomID(1); r <= rooms; r++ {
		if _, err := h.pre.Open(r, 0, 0); err != nil {
			t.Fatalf("prefill open %d: %v", r, err)
		}
	}
	h.openDecode(1, 1)
	select {
	case <-held.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("room 1's METADATA never reached prefill's owner")
	}
	return h, held
}

// advanceHeld moves virtual time by d one tick at a time while prefill's
// owner is held, waiting after each tick (in real time, bounded) until the
// network is idle: every frame sent so far was read. A reader that waits
// for the held owner never lets the network go idle.
func advanceHeld(t *testing.T, h *harness, d time.Duration) {
	t.Helper()
	for el := time.Duration(0); el < d; el += tTick {
		h.clk.Advance(tTick)
		if !h.waitReal(10*time.Second, h.net.Idle) {
			t.Fatalf("%v into the hold, frames are still unread: a reader waits for the held owner", el)
		}
	}
}

// checkOnce checks that the owner stepped each frame once (with ordered,
// in seq order per peer) and that every room was bound exactly once.
func checkOnce(t *testing.T, h *harness, held *heldOwner, keys []poll.Key, ordered bool) {
	t.Helper()
	got := held.deliveries()
	last := map[poll.PeerID]uint64{}
	seen := map[delivery]bool{}
	for i, d := range got {
		if seen[d] {
			t.Fatalf("step %d: peer %d's frame seq %d stepped twice (all: %v)", i, d.peer, d.seq, got)
		}
		seen[d] = true
		if ordered && d.seq <= last[d.peer] {
			t.Fatalf("step %d of peer %d's frames has seq %d after seq %d: out of order (all: %v)", i, d.peer, d.seq, last[d.peer], got)
		}
		last[d.peer] = d.seq
	}
	if len(got) != len(keys) {
		t.Fatalf("owner stepped %d room frames, want %d (one METADATA per room): %v", len(got), len(keys), got)
	}
	h.preDP.mu.Lock()
	defer h.preDP.mu.Unlock()
	for _, k := range keys {
		if n := len(h.preDP.binds[k]); n != 1 {
			t.Errorf("room %d bound %d times on prefill, want once", k.Room, n)
		}
	}
}

// TestHeldOwnerKeepsItsPeerUpAndAnswersEveryFrameOnceInOrder: prefill's
// owner is held in a step for four peer-loss bounds while decode keeps
// sending heartbeats, new METADATA and retransmits. Prefill's reader keeps
// reading (heartbeats count, nobody is lost on either side), no ACK leaves
// before the owner answers, and once released every frame is stepped
// once, in order, and ACKed.
func TestHeldOwnerKeepsItsPeerUpAndAnswersEveryFrameOnceInOrder(t *testing.T) {
	const rooms = 8
	h, held := holdPrefillOwner(t, rooms, nil)
	for r := poll.RoomID(2); r <= rooms; r++ {
		h.openDecode(r, 1)
	}
	hbBefore := h.pre.Counters().Frames(conn.FrameHeartbeat, conn.Received)
	bound := time.Duration(tMisses) * tHeartbeat
	advanceHeld(t, h, 4*bound)
	if n := h.pre.Counters().Frames(conn.FrameHeartbeat, conn.Received) - hbBefore; n < 4*tMisses-1 {
		t.Errorf("prefill read %d heartbeats in %v of hold, want about %d", n, 4*bound, 4*tMisses)
	}
	for _, side := range []struct {
		name string
		ctr  conn.Counters
		up   []conn.PeerInfo
	}{{"prefill", h.pre.Counters(), h.pre.Peers()}, {"decode", h.dec.Counters(), h.dec.Peers()}} {
		if side.ctr.PeersLost != 0 || len(side.up) != 1 || !side.up[0].Up {
			t.Fatalf("%s lost its peer while prefill's owner was held: lost %d, peers %+v", side.name, side.ctr.PeersLost, side.up)
		}
	}
	if n := h.dec.lk.UnackedRoomFrames(); n != rooms {
		t.Fatalf("decode has %d METADATA unacknowledged during the hold, want %d: an ACK left before the owner answered", n, rooms)
	}
	for r := poll.RoomID(1); r <= rooms; r++ {
		if s := h.decState(r); s != poll.Bootstrapping {
			t.Fatalf("decode room %d is %v during the hold, want Bootstrapping", r, s)
		}
	}
	held.unblock()
	if _, ok := h.until(tBoot, func() bool {
		for r := poll.RoomID(1); r <= rooms; r++ {
			if h.decState(r) != poll.WaitingForInput {
				return false
			}
		}
		return h.dec.lk.UnackedRoomFrames() == 0
	}); !ok {
		t.Fatalf("not every METADATA was ACKed applied after the release (%d unacked)", h.dec.lk.UnackedRoomFrames())
	}
	var keys []poll.Key
	for r := poll.RoomID(1); r <= rooms; r++ {
		keys = append(keys, keysOf(h.pre, r))
	}
	checkOnce(t, h, held, keys, true)
}

// TestRetransmitCrossingAFrameWithTheOwnerIsNotAppliedTwice: decode
// retransmits room 1's METADATA many times while its first copy is held
// in prefill's owner. The copies are dropped as duplicates, not queued
// again and not answered early; the owner's ACK answers them all.
func TestRetransmitCrossingAFrameWithTheOwnerIsNotAppliedTwice(t *testing.T) {
	h, held := holdPrefillOwner(t, 1, nil)
	advanceHeld(t, h, 20*tTick)
	if n := h.dec.Counters().Retransmits; n < 2 {
		t.Fatalf("decode retransmitted %d times during the hold, want at least 2", n)
	}
	if n := h.dec.lk.UnackedRoomFrames(); n != 1 {
		t.Fatalf("decode's METADATA was answered before prefill's owner stepped it (%d unacked)", n)
	}
	dups := h.pre.Counters().Rejected(conn.RejectDuplicate)
	held.unblock()
	if _, ok := h.until(tBoot, func() bool { return h.decState(1) == poll.WaitingForInput && h.dec.lk.UnackedRoomFrames() == 0 }); !ok {
		t.Fatalf("room 1 not WaitingForInput on decode after the release (%v)", h.decState(1))
	}
	checkOnce(t, h, held, []poll.Key{keysOf(h.pre, 1)}, true)
	if dups < 2 {
		t.Fatalf("prefill dropped %d retransmits as duplicates during the hold, want every one", dups)
	}
}

// TestFramesBeyondTheOwnersBoundAreDroppedCountedAndRetransmitted: with
// four frames allowed out with prefill's owner and the owner held, the
// reader takes three more METADATA and drops the next six unanswered,
// counting each (owner_busy), without waiting; once the owner is back the
// peer's retransmits deliver them and every room is bound once.
func TestFramesBeyondTheOwnersBoundAreDroppedCountedAndRetransmitted(t *testing.T) {
	const rooms, limit = 10, 4
	h, held := holdPrefillOwner(t, rooms, func(c *PrefillConfig) { c.MaxUnansweredFrames = limit })
	for r := poll.RoomID(2); r <= rooms; r++ {
		h.openDecode(r, 1)
	}
	dropped := func() uint64 { return h.pre.Counters().Rejected(conn.RejectOwnerBusy) }
	if !h.waitReal(10*time.Second, func() bool { return h.net.Idle() && dropped() >= rooms-limit }) {
		t.Fatalf("prefill dropped %d frames over the bound, want %d (reader stuck or frames queued past the bound)", dropped(), rooms-limit)
	}
	if n := dropped(); n != rooms-limit {
		t.Fatalf("prefill dropped %d frames over the bound, want exactly %d", n, rooms-limit)
	}
	if n := h.pre.lk.Unanswered(); n != limit {
		t.Fatalf("%d frames out with prefill's owner, want the bound %d", n, limit)
	}
	held.unblock()
	if _, ok := h.until(tBoot, func() bool {
		for r := poll.RoomID(1); r <= rooms; r++ {
			if h.decState(r) != poll.WaitingForInput {
				return false
			}
		}
		return h.dec.lk.UnackedRoomFrames() == 0
	}); !ok {
		t.Fatalf("the dropped METADATA were not delivered by retransmit (%d unacked)", h.dec.lk.UnackedRoomFrames())
	}
	var keys []poll.Key
	for r := poll.RoomID(1); r <= rooms; r++ {
		keys = append(keys, keysOf(h.pre, r))
	}
	// Retransmits of one tick leave in the outbox's map order: once, not
	// in order.
	checkOnce(t, h, held, keys, false)
	if n := h.pre.lk.Unanswered(); n != 0 {
		t.Fatalf("%d frames still out with prefill's owner after every room was answered", n)
	}
}

// keysOf is the room's key on a node.
func keysOf(n interface {
	Get(poll.RoomID) (poll.RoomInfo, error)
}, room poll.RoomID) poll.Key {
	info, _ := n.Get(room)
	return info.Key
}

// TestFramesWithTheOwnerWhenItStopsAreCancelledNotAnswered: prefill is
// killed while its owner is held in room 1's step and rooms 2-4's
// METADATA wait behind it. Room 1's step finishes (and answers); the
// frames behind it are not stepped and no ACK leaves for them: decode
// keeps retransmitting them (to prefill's next incarnation).
func TestFramesWithTheOwnerWhenItStopsAreCancelledNotAnswered(t *testing.T) {
	const rooms = 4
	h, held := holdPrefillOwner(t, rooms, nil)
	for r := poll.RoomID(2); r <= rooms; r++ {
		h.openDecode(r, 1)
	}
	if !h.waitReal(10*time.Second, func() bool { return h.net.Idle() && h.pre.lk.Unanswered() == rooms }) {
		t.Fatalf("%d frames out with prefill's owner, want %d", h.pre.lk.Unanswered(), rooms)
	}
	pre := h.pre
	killed := make(chan struct{})
	go func() { defer close(killed); pre.kill() }()
	if !h.waitReal(10*time.Second, func() bool { return ownerState(pre.own.state.Load()) == ownerStopping }) {
		t.Fatal("prefill's owner was never asked to stop")
	}
	held.unblock()
	select {
	case <-killed:
	case <-time.After(10 * time.Second):
		t.Fatal("kill did not return once the held step finished")
	}
	h.pre = nil // killed: the harness does not close it again
	if n := pre.lk.Unanswered(); n != 0 {
		t.Fatalf("%d tokens still out after the owner stopped, want every one cancelled", n)
	}
	if got := held.deliveries(); len(got) != 1 {
		t.Fatalf("the stopping owner stepped %d frames, want only the one it was in: %v", len(got), got)
	}
	for r := poll.RoomID(2); r <= rooms; r++ {
		if k := keysOf(h.dec, r); h.preDP.bound(k) {
			t.Errorf("room %d bound on the stopped prefill: a queued frame was stepped", r)
		}
	}
	if !h.waitReal(10*time.Second, h.net.Idle) {
		t.Fatal("network not idle after the kill")
	}
	if n := h.dec.lk.UnackedRoomFrames(); n < rooms-1 {
		t.Fatalf("decode has %d METADATA unacknowledged, want at least %d: a cancelled frame was answered", n, rooms-1)
	}
}
