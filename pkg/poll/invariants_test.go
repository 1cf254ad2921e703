package poll

import (
	"testing"
	"time"
)

// I3: frames about rooms never opened create nothing and are answered
// NotOpen, so the peer may retry until its own deadline.
func TestFrameForUnknownRoomNeverCreatesState_I3(t *testing.T) {
	h := newHarness(t, Prefill)
	for _, k := range []EventKind{EvMetadata, EvFirstChunk, EvProgress, EvDone, EvFenced} {
		h.expectErr(ev(k, 9, 42, testPeer), ErrNotFound)
	}
	h.expectErr(local(EvClear, 9), ErrNotFound)
	if s := h.tab.Stats(h.now); s.Rooms != 0 || s.Tombstones != 0 || s.Rejected(RejectUnknownRoom) != 6 {
		t.Fatalf("unknown frames left state or were not counted: %+v", s)
	}
	if !h.has(EffReplyUnknown, 9, func(e Effect) bool { return e.Reply == ReplyNotOpen && e.Peer == testPeer }) {
		t.Fatalf("not answered:\n%s", formatEffects(h.effects))
	}
	if _, err := h.tab.Get(9); err != ErrNotFound {
		t.Fatalf("Get: %v", err)
	}
}

// I7: a terminal room the scheduler never clears is reaped after the
// linger, counted as uncleared, and leaves an ended tombstone.
func TestUnclearedTerminalRoomIsReaped_I7(t *testing.T) {
	h := reach(t, inSuccess)
	h.advance(lingerT - 1)
	h.expectState(1, Success)
	h.advance(1)
	if got := h.visible(1); got != StateNone {
		t.Fatalf("room still visible as %v", got)
	}
	if !h.has(EffReaped, 1, func(e Effect) bool { return e.Reason == ReasonUncleared && e.Status == Success }) {
		t.Fatalf("no Reaped effect:\n%s", formatEffects(h.effects))
	}
	s := h.tab.Stats(h.now)
	if s.ReapedUncleared != 1 || s.Tombstones != 1 || s.Rooms != 0 {
		t.Fatalf("stats after reap: %+v", s)
	}
	h.expectErr(local(EvClear, 1), ErrRoomEnded)
}

// I9: the scheduler does not see Failed while the room's worker may still
// touch its pages, and cannot clear (free pages) before the fence.
func TestFailedIsHiddenUntilFenced_I9(t *testing.T) {
	h := reach(t, inTransferring)
	h.must(Event{Kind: EvAbortLocal, Key: Key{Room: 1}, Reason: ReasonChecksum})
	h.expectState(1, Failed)
	if got := h.visible(1); got != Transferring {
		t.Fatalf("scheduler sees %v before the fence", got)
	}
	if !h.has(EffFence, 1, nil) || h.has(EffTransition, 1, func(e Effect) bool { return e.To == Failed && e.Visible }) {
		t.Fatalf("want a Fence and a hidden transition:\n%s", formatEffects(h.effects))
	}
	h.expectErr(local(EvClear, 1), ErrNotTerminal)
	h.expectErr(local(EvProgress, 1), ErrTerminal) // the worker's late progress

	h.take()
	h.must(local(EvFenced, 1))
	if got := h.visible(1); got != Failed {
		t.Fatalf("scheduler sees %v after the fence", got)
	}
	if !h.has(EffPublish, 1, func(e Effect) bool { return e.Reason == ReasonChecksum }) {
		t.Fatalf("no Publish:\n%s", formatEffects(h.effects))
	}
	h.must(local(EvFenced, 1)) // idempotent
	h.must(local(EvClear, 1))
}

// I6: clear and reap remove a room from every table in the same call; the
// harness checks CheckInvariants after every step, this test checks the
// peer index directly too.
func TestRemovalFinalisesEveryIndex_I6(t *testing.T) {
	h := newHarness(t, Decode)
	for i := RoomID(1); i <= 50; i++ {
		h.must(open(i, Nonce(i), testPeer))
	}
	for i := RoomID(1); i <= 50; i += 2 {
		h.must(local(EvAbortLocal, i))
		h.must(local(EvFenced, i))
		h.must(local(EvClear, i))
	}
	h.must(Event{Kind: EvPeerLost, Peer: testPeer})
	for i := RoomID(2); i <= 50; i += 2 {
		h.expectState(i, Failed)
	}
	if len(h.tab.peers) != 0 {
		t.Fatalf("peer index keeps %d entries", len(h.tab.peers))
	}
	h.advance(lingerT)
	if s := h.tab.Stats(h.now); s.Rooms != 0 || s.ReapedUncleared != 25 {
		t.Fatalf("after linger: %+v", s)
	}
}

// I5 holds at every entry point, not only on Tick: a Step far in the future
// first expires what is due.
func TestStepExpiresDeadlinesFirst_I5(t *testing.T) {
	h := reach(t, inTransferring)
	h.now += at(idleT) + 1
	h.expectErr(local(EvProgress, 1), ErrTerminal)
	if r := h.reason(1); r != ReasonTimeoutTransferring {
		t.Fatalf("reason %q", r)
	}
}

func TestTimeNeverGoesBackwards(t *testing.T) {
	h := reach(t, inBootstrapping)
	h.now = at(5 * time.Second)
	h.advance(0)
	h.now = 0 // clock hiccup
	h.must(ev(EvMetadata, 1, 42, testPeer))
	info, _ := h.tab.Get(1)
	if info.StateEnteredAt != at(5*time.Second) {
		t.Fatalf("entered at %d, want clamped to 5s", info.StateEnteredAt)
	}
}

func TestHistoryIsBoundedAndTimestamped(t *testing.T) {
	c := testConfig(Decode)
	c.HistoryLen = 2
	tab, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	steps := []Event{open(1, 42, testPeer), ev(EvMetadata, 1, 42, testPeer), local(EvFirstChunk, 1), local(EvDone, 1)}
	for i, e := range steps {
		if err := tab.Step(int64(i+1), e); err != nil {
			t.Fatal(err)
		}
	}
	info, _ := tab.Get(1)
	want := []HistoryEntry{{At: 3, From: WaitingForInput, To: Transferring}, {At: 4, From: Transferring, To: Success}}
	if len(info.History) != 2 || info.History[0] != want[0] || info.History[1] != want[1] || info.HistoryDropped != 2 {
		t.Fatalf("history %+v dropped %d", info.History, info.HistoryDropped)
	}
}

func TestReadSide(t *testing.T) {
	h := newHarness(t, Decode)
	for i := RoomID(1); i <= 5; i++ {
		h.must(open(i, Nonce(i), testPeer))
		h.advance(time.Second)
	}
	h.must(ev(EvMetadata, 3, 3, testPeer))
	h.advance(3 * time.Second) // 5s after room 1: overdue past half of 10s
	states := h.tab.Poll([]RoomID{1, 3, 99}, make([]State, 0, 3))
	if states[0] != Bootstrapping || states[1] != WaitingForInput || states[2] != StateNone {
		t.Fatalf("Poll = %v", states)
	}
	s := h.tab.Stats(h.now)
	if s.Inflight != 5 || s.Count(Bootstrapping) != 4 || s.OldestAge(Bootstrapping) != 8*time.Second ||
		s.Overdue(Bootstrapping) != 3 || s.Deadline(Bootstrapping) != bootT ||
		s.Transitions(StateNone, Bootstrapping) != 5 || s.Transitions(Bootstrapping, WaitingForInput) != 1 {
		t.Fatalf("stats: %+v", s)
	}
	page, next, err := h.tab.List(h.now, Filter{State: Bootstrapping}, "", 2)
	if err != nil || len(page) != 2 || page[0].Key.Room != 1 || page[1].Key.Room != 2 || next != "2" {
		t.Fatalf("List page 1: %v %q %v", page, next, err)
	}
	page, next, _ = h.tab.List(h.now, Filter{State: Bootstrapping}, next, 2)
	if len(page) != 2 || page[0].Key.Room != 4 || page[1].Key.Room != 5 || next != "" {
		t.Fatalf("List page 2: %v %q", page, next)
	}
	page, _, _ = h.tab.List(h.now, Filter{MinAge: 7 * time.Second}, "", 0)
	if len(page) != 2 {
		t.Fatalf("MinAge filter: %d rooms", len(page))
	}
}

func TestReasonsAreAClosedSet(t *testing.T) {
	all := AllReasons()
	if len(all) != 13 {
		t.Fatalf("%d failure reasons", len(all))
	}
	for _, r := range all {
		if got, ok := ParseReason(string(r)); !ok || got != r {
			t.Errorf("ParseReason(%q) = %q %v", r, got, ok)
		}
	}
	if got, ok := ParseReason("disk on fire"); ok || got != ReasonInvalid {
		t.Errorf("unknown reason maps to %q %v", got, ok)
	}
	if _, ok := ParseReason(string(ReasonUncleared)); ok {
		t.Error("uncleared is not a failure reason")
	}
}

func TestMaxRoomsIsEnforced(t *testing.T) {
	c := testConfig(Decode)
	c.MaxRooms = 2
	tab, _ := New(c)
	_ = tab.Step(0, open(1, 1, testPeer))
	_ = tab.Step(0, open(2, 2, testPeer))
	if err := tab.Step(0, open(3, 3, testPeer)); err != ErrResourceExhausted {
		t.Fatalf("third open: %v", err)
	}
}
