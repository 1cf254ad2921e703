package poll

import (
	"fmt"
	"testing"
	"time"
)

// R1: Failed must never be overwritten by a late WaitingForInput,
// Transferring or Success (the reference used max() over state numbers).
func TestFailedIsNotOverwrittenByLateSuccess_R1(t *testing.T) {
	h := newHarness(t, Decode)
	h.must(open(1, 42, testPeer))
	h.must(ev(EvMetadata, 1, 42, testPeer))
	h.must(local(EvFirstChunk, 1))
	h.must(Event{Kind: EvAbortRemote, Key: Key{1, 42}, Peer: testPeer, Reason: ReasonTimeoutTransferring})
	h.must(local(EvFenced, 1))

	// Late events of every "higher" state arrive.
	h.expectErr(local(EvDone, 1), ErrTerminal)
	h.expectErr(local(EvProgress, 1), ErrTerminal)
	h.expectErr(local(EvFirstChunk, 1), ErrTerminal)
	h.expectErr(ev(EvMetadata, 1, 42, testPeer), ErrTerminal)

	h.expectState(1, Failed)
	if got := h.visible(1); got != Failed {
		t.Fatalf("scheduler sees %v, want Failed", got)
	}
	if r := h.reason(1); r != ReasonAbortedRemote {
		t.Fatalf("reason %q changed", r)
	}
	if n := h.tab.Stats(h.now).Rejected(RejectTerminal); n != 4 {
		t.Fatalf("terminal rejections %d, want 4", n)
	}
}

// R2: a late update after clear must not re-insert the room, and a later
// request with the same room id must not see a stale status.
func TestLateUpdateAfterClearDoesNotReinsert_R2(t *testing.T) {
	h := newHarness(t, Prefill)
	h.must(open(1, 0, NoPeer))
	h.must(ev(EvMetadata, 1, 42, testPeer))
	h.must(local(EvFirstChunk, 1))
	h.must(ev(EvDone, 1, 42, testPeer)) // decode's STATUS Success
	h.must(local(EvClear, 1))
	h.take()

	// Late frames about the cleared room: answered with its outcome, never
	// stored.
	h.expectErr(ev(EvDone, 1, 42, testPeer), ErrRoomEnded)
	h.expectErr(ev(EvMetadata, 1, 42, testPeer), ErrRoomEnded)
	h.expectErr(Event{Kind: EvAbortRemote, Key: Key{1, 42}, Peer: testPeer}, ErrRoomEnded)
	if got := h.visible(1); got != StateNone {
		t.Fatalf("cleared room reappeared as %v", got)
	}
	if !h.has(EffReplyUnknown, 1, func(e Effect) bool { return e.Reply == ReplyEnded && e.Status == Success }) {
		t.Fatalf("late frame not answered with the ended outcome:\n%s", formatEffects(h.effects))
	}

	// A new request reuses room id 1: it starts clean, and a late frame of
	// the old request (nonce 42) does not bind or touch it.
	h.must(open(1, 0, NoPeer))
	h.expectErr(ev(EvMetadata, 1, 42, testPeer), ErrRoomEnded)
	h.expectState(1, Bootstrapping)
	h.must(ev(EvMetadata, 1, 43, otherPeer))
	h.expectState(1, WaitingForInput)
	if info, _ := h.tab.Get(1); info.Key.Nonce != 43 || len(info.History) != 2 {
		t.Fatalf("new room carries old state: %+v", info)
	}
}

// R3: late metadata for a room prefill already timed out must not create
// orphan state, and decode must be told at once instead of waiting for its
// own waiting timeout.
func TestLateMetadataForTimedOutRoomIsAnsweredFailed_R3(t *testing.T) {
	h := newHarness(t, Prefill)
	h.must(open(1, 0, NoPeer))
	h.advance(bootT) // no METADATA: timeout:bootstrapping
	h.expectState(1, Failed)
	h.take()

	h.expectErr(ev(EvMetadata, 1, 42, testPeer), ErrTerminal)
	if !h.has(EffNotifyPeer, 1, func(e Effect) bool {
		return e.Peer == testPeer && e.Key.Nonce == 42 && e.Status == Failed && e.Reason == ReasonTimeoutBootstrapping
	}) {
		t.Fatalf("decode not told:\n%s", formatEffects(h.effects))
	}

	// Same after the scheduler cleared it: the ended tombstone answers.
	h.must(local(EvFenced, 1))
	h.must(local(EvClear, 1))
	h.take()
	h.expectErr(ev(EvMetadata, 1, 42, testPeer), ErrRoomEnded)
	if !h.has(EffReplyUnknown, 1, func(e Effect) bool {
		return e.Reply == ReplyEnded && e.Status == Failed && e.Reason == ReasonTimeoutBootstrapping
	}) {
		t.Fatalf("late metadata after clear not answered:\n%s", formatEffects(h.effects))
	}
	if h.tab.Stats(h.now).Rooms != 0 {
		t.Fatal("late metadata created state")
	}
}

// R4: an ABORT that arrives before prefill has seen the room must not be
// dropped: the later open fails at once with the abort's reason.
func TestAbortBeforeOpenLeavesTombstone_R4(t *testing.T) {
	h := newHarness(t, Prefill)
	h.must(Event{Kind: EvAbortRemote, Key: Key{1, 42}, Peer: testPeer, Reason: ReasonAbortedLocal})
	if s := h.tab.Stats(h.now); s.Tombstones != 1 || s.Rooms != 0 {
		t.Fatalf("abort before open: tombstones %d rooms %d", s.Tombstones, s.Rooms)
	}
	h.advance(time.Second)
	h.must(open(1, 0, NoPeer)) // prefill opens without a nonce
	h.expectState(1, Failed)
	if got := h.visible(1); got != Failed {
		t.Fatalf("scheduler sees %v; a room born failed needs no fence", got)
	}
	info, _ := h.tab.Get(1)
	if info.Reason != ReasonAbortedRemote || info.PeerReason != ReasonAbortedLocal || info.Key.Nonce != 42 {
		t.Fatalf("born-failed room: %+v", info)
	}
	if s := h.tab.Stats(h.now); s.Tombstones != 0 {
		t.Fatal("tombstone not consumed by the open")
	}
}

// endUnboundAndClear opens prefill's room id, aborts it before any decode
// bound it (nonce 0), fences and clears it: what the previous request with
// that id leaves is its unbound ended tombstone.
func (h *harness) endUnboundAndClear(id RoomID) {
	h.t.Helper()
	h.must(open(id, 0, NoPeer))
	h.must(local(EvAbortLocal, id))
	h.must(local(EvFenced, id))
	h.must(local(EvClear, id))
	h.take()
}

// R4 across room id reuse: prefill's previous room with this id ended
// unbound (aborted before decode's METADATA, nonce 0) and was cleared.
// Decode's next request opens the id and aborts before prefill opened it:
// the ended tombstone never learned a nonce, so it must not swallow that
// ABORT; prefill's open is born Failed instead of waiting out its
// bootstrap deadline.
func TestAbortForReusedIDAfterUnboundEndLeavesTombstone_R4(t *testing.T) {
	h := newHarness(t, Prefill)
	h.endUnboundAndClear(1)

	h.must(Event{Kind: EvAbortRemote, Key: Key{1, 43}, Peer: testPeer, Reason: ReasonAbortedLocal})
	h.must(open(1, 0, NoPeer))
	h.expectState(1, Failed)
	info, _ := h.tab.Get(1)
	if info.Reason != ReasonAbortedRemote || info.PeerReason != ReasonAbortedLocal || info.Key.Nonce != 43 {
		t.Fatalf("reused id's room after decode's early abort: %+v", info)
	}
}

// The other side of that rule: once an unbound ended tombstone answered a
// request's METADATA (Ended), it is that request's; its late ABORT is
// answered as ended and leaves nothing for the next request with the id,
// and another request's METADATA is not answered with its outcome.
func TestUnboundEndedTombstoneLearnsTheNonceItAnswered_R3(t *testing.T) {
	h := newHarness(t, Prefill)
	h.endUnboundAndClear(1)

	h.expectErr(ev(EvMetadata, 1, 42, testPeer), ErrRoomEnded) // R3: told it ended
	h.expectErr(Event{Kind: EvAbortRemote, Key: Key{1, 42}, Peer: testPeer, Reason: ReasonTimeoutWaitingForInput}, ErrRoomEnded)
	if s := h.tab.Stats(h.now); s.Tombstones != 1 {
		t.Fatalf("tombstones %d, want only the ended one", s.Tombstones)
	}
	h.take()
	h.expectErr(ev(EvMetadata, 1, 43, testPeer), ErrNotFound) // the next request's, early
	if !h.has(EffReplyUnknown, 1, func(e Effect) bool { return e.Reply == ReplyNotOpen && e.Key.Nonce == 43 }) {
		t.Fatalf("next request's early metadata not answered NotOpen:\n%s", formatEffects(h.effects))
	}
	h.must(open(1, 0, NoPeer))
	h.expectState(1, Bootstrapping)
	h.expectErr(ev(EvMetadata, 1, 42, testPeer), ErrRoomEnded) // the old one's, late
	h.must(ev(EvMetadata, 1, 43, testPeer))
	h.expectState(1, WaitingForInput)
}

func TestAbortTombstoneExpiresAndIsBounded_I4(t *testing.T) {
	h := newHarness(t, Decode)
	for i := RoomID(1); i <= maxTombs+4; i++ {
		h.must(Event{Kind: EvAbortLocal, Key: Key{Room: i}})
	}
	s := h.tab.Stats(h.now)
	if s.Tombstones != maxTombs || s.TombstonesEvicted != 4 {
		t.Fatalf("tombstones %d evicted %d, want %d and 4", s.Tombstones, s.TombstonesEvicted, maxTombs)
	}
	// The oldest were evicted: room 1 opens normally, room 5 fails.
	h.must(open(1, 9, testPeer))
	h.expectState(1, Bootstrapping)
	h.must(open(5, 9, testPeer))
	h.expectState(5, Failed)

	h.advance(tombTTL)
	if s := h.tab.Stats(h.now); s.Tombstones != 0 || s.TombstonesExpired != maxTombs-1 {
		t.Fatalf("after TTL: tombstones %d expired %d", s.Tombstones, s.TombstonesExpired)
	}
	h.must(open(6, 9, testPeer))
	h.expectState(6, Bootstrapping) // its abort expired
}

// R5: two requests sharing a room id: the second open is refused and
// counted; the first room is untouched by the other's frames and clear.
func TestRoomIDCollisionIsRefused_R5(t *testing.T) {
	h := newHarness(t, Decode)
	h.must(open(1, 42, testPeer))
	h.must(ev(EvMetadata, 1, 42, testPeer))
	h.must(local(EvFirstChunk, 1))

	h.expectErr(open(1, 43, testPeer), ErrCollision)
	h.expectErr(open(1, 42, testPeer), ErrAlreadyExists)
	if s := h.tab.Stats(h.now); s.Collisions != 1 {
		t.Fatalf("collisions %d, want 1", s.Collisions)
	}

	// The other request's frames never conclude or abort this room.
	h.expectErr(ev(EvDone, 1, 43, testPeer), ErrNonceMismatch)
	h.expectErr(Event{Kind: EvAbortRemote, Key: Key{1, 43}, Peer: testPeer}, ErrNonceMismatch)
	h.expectErr(Event{Kind: EvClear, Key: Key{1, 43}}, ErrNonceMismatch)
	h.expectState(1, Transferring)
	if !h.has(EffNotifyPeer, 1, func(e Effect) bool { return e.Key.Nonce == 43 && e.Reason == ReasonCollision }) {
		t.Fatalf("colliding sender not told:\n%s", formatEffects(h.effects))
	}
	h.must(ev(EvDone, 1, 42, testPeer))
	h.expectState(1, Success)
}

// R9: every non-terminal state has a deadline and a room left alone in it
// fails with timeout:<state>; the peer is told.
func TestEveryStateHasADeadline_R9(t *testing.T) {
	cases := []struct {
		s      start
		after  time.Duration
		reason Reason
	}{
		{inBootstrapping, bootT, ReasonTimeoutBootstrapping},
		{inWaiting, waitT, ReasonTimeoutWaitingForInput},
		{inTransferring, idleT, ReasonTimeoutTransferring},
	}
	for _, tc := range cases {
		t.Run(startNames[tc.s], func(t *testing.T) {
			h := reach(t, tc.s)
			h.advance(tc.after - 1)
			h.expectState(1, stateOfClass[tc.s])
			h.advance(1)
			h.expectState(1, Failed)
			if r := h.reason(1); r != tc.reason {
				t.Fatalf("reason %q, want %q", r, tc.reason)
			}
			if !h.has(EffFence, 1, nil) || !h.has(EffNotifyPeer, 1, func(e Effect) bool { return e.Reason == tc.reason }) {
				t.Fatalf("timeout must fence and tell the peer:\n%s", formatEffects(h.effects))
			}
		})
	}
	// Config refuses a missing deadline.
	for _, field := range []string{"BootstrapTimeout", "WaitingTimeout", "TransferIdleTimeout", "ClearLinger"} {
		c := testConfig(Decode)
		switch field {
		case "BootstrapTimeout":
			c.BootstrapTimeout = 0
		case "WaitingTimeout":
			c.WaitingTimeout = 0
		case "TransferIdleTimeout":
			c.TransferIdleTimeout = 0
		case "ClearLinger":
			c.ClearLinger = 0
		}
		if _, err := New(c); err == nil || !contains(err.Error(), field) {
			t.Errorf("config without %s: %v", field, err)
		}
	}
}

func TestProgressRefreshesIdleDeadline_R9(t *testing.T) {
	h := reach(t, inTransferring)
	for i := 0; i < 10; i++ {
		h.advance(idleT - time.Second)
		h.must(local(EvProgress, 1))
	}
	h.expectState(1, Transferring)
	h.advance(idleT)
	h.expectState(1, Failed)
}

// R10: a peer that is lost or restarts fails every live room bound to it,
// and only those.
func TestPeerRestartFailsItsRooms_R10(t *testing.T) {
	h := newHarness(t, Prefill)
	for i := RoomID(1); i <= 3; i++ {
		h.must(open(i, 0, NoPeer))
		h.must(ev(EvMetadata, i, Nonce(100+i), testPeer))
	}
	h.must(open(4, 0, NoPeer))
	h.must(ev(EvMetadata, 4, 104, otherPeer))
	h.must(local(EvFirstChunk, 3))
	h.must(ev(EvDone, 3, 103, testPeer)) // terminal: not touched
	h.must(Event{Kind: EvPeerRestarted, Peer: testPeer})
	for i, want := range []State{Failed, Failed, Success, WaitingForInput} {
		h.expectState(RoomID(i+1), want)
	}
	if r := h.reason(1); r != ReasonPeerRestarted {
		t.Fatalf("reason %q", r)
	}
	h.must(Event{Kind: EvPeerLost, Peer: otherPeer})
	if r := h.reason(4); r != ReasonPeerLost {
		t.Fatalf("reason %q", r)
	}
}

// R10, issue 12: a prefill restart seen by decode (EvPeerReplaced). A room
// the old instance never applied (Bootstrapping) moves to the new instance
// and is served by it; the rooms it applied fail with peer_restarted at
// once and only those are told to the new instance; terminal rooms and
// rooms of other peers are untouched.
func TestPeerReplacedMovesRoomsTheOldInstanceNeverApplied_R10(t *testing.T) {
	const newPeer = PeerID(9)
	h := newHarness(t, Decode)
	h.must(open(1, 101, testPeer)) // Bootstrapping: METADATA not applied
	h.must(open(2, 102, testPeer))
	h.must(ev(EvMetadata, 2, 102, testPeer)) // WaitingForInput: applied
	h.must(open(3, 103, testPeer))
	h.must(ev(EvMetadata, 3, 103, testPeer))
	h.must(local(EvFirstChunk, 3)) // Transferring
	h.must(open(4, 104, testPeer))
	h.must(ev(EvMetadata, 4, 104, testPeer))
	h.must(local(EvFirstChunk, 4))
	h.must(local(EvDone, 4)) // Success
	h.must(open(5, 105, otherPeer))
	h.take()

	h.must(Event{Kind: EvPeerReplaced, Peer: testPeer, NewPeer: newPeer})
	effs := h.take()
	for i, want := range []State{Bootstrapping, Failed, Failed, Success, Bootstrapping} {
		h.expectState(RoomID(i+1), want)
	}
	for _, id := range []RoomID{2, 3} {
		if r := h.reason(id); r != ReasonPeerRestarted {
			t.Fatalf("room %d reason %q, want peer_restarted", id, r)
		}
	}
	var rebound, told []RoomID
	for _, e := range effs {
		switch e.Kind {
		case EffRebound:
			if e.Peer != newPeer || e.Status != Bootstrapping {
				t.Fatalf("rebound to peer %d in %v: %s", e.Peer, e.Status, formatEffect(e))
			}
			rebound = append(rebound, e.Key.Room)
		case EffNotifyPeer:
			if e.Peer != newPeer || e.Status != Failed || e.Reason != ReasonPeerRestarted {
				t.Fatalf("notice %s, want Failed(peer_restarted) to the new instance", formatEffect(e))
			}
			told = append(told, e.Key.Room)
		}
	}
	if fmt.Sprint(rebound) != "[1]" {
		t.Fatalf("rebound rooms %v, want [1]:\n%s", rebound, formatEffects(effs))
	}
	if len(told) != 2 || told[0]+told[1] != 5 {
		t.Fatalf("new instance told about rooms %v, want 2 and 3:\n%s", told, formatEffects(effs))
	}
	if info, _ := h.tab.Get(1); info.Peer != newPeer {
		t.Fatalf("room 1 bound to peer %d, want %d", info.Peer, newPeer)
	}
	if s := h.tab.Stats(h.now); s.Rebound != 1 || s.Failures(ReasonPeerRestarted) != 2 {
		t.Fatalf("rebound %d, peer_restarted failures %d", s.Rebound, s.Failures(ReasonPeerRestarted))
	}
	if err := h.tab.CheckInvariants(); err != nil {
		t.Fatal(err)
	}

	// The moved room belongs to the new instance: its ACK applies, the dead
	// one's is refused, and the new instance's loss fails it.
	h.expectErr(ev(EvMetadata, 1, 101, testPeer), ErrPeerMismatch)
	h.must(ev(EvMetadata, 1, 101, newPeer))
	h.expectState(1, WaitingForInput)
	h.must(Event{Kind: EvPeerLost, Peer: newPeer})
	h.expectState(1, Failed)
	h.expectState(5, Bootstrapping)
}

// Prefill keeps EvPeerRestarted: a decode peer holds every prefill room
// from its own Open, so no prefill room may move to a new decode instance.
func TestPeerReplacedIsRefusedOnPrefill(t *testing.T) {
	h := newHarness(t, Prefill)
	h.must(open(1, 0, testPeer))
	h.expectErr(Event{Kind: EvPeerReplaced, Peer: testPeer, NewPeer: otherPeer}, ErrInvalidEvent)
	if info, _ := h.tab.Get(1); info.Peer != testPeer || info.State != Bootstrapping {
		t.Fatalf("room 1 %v peer %d", info.State, info.Peer)
	}
}

// R11: a room waits for every distinct rank; duplicates do not count.
func TestMultiRankNeedsEveryDistinctRank_R11(t *testing.T) {
	h := newHarness(t, Decode)
	h.must(Event{Kind: EvOpen, Key: Key{1, 42}, Peer: testPeer, Ranks: 3})
	h.must(ev(EvMetadata, 1, 42, testPeer))
	h.must(local(EvFirstChunk, 1))
	h.must(Event{Kind: EvDone, Key: Key{Room: 1}, Rank: 0})
	h.must(Event{Kind: EvDone, Key: Key{Room: 1}, Rank: 0}) // duplicate
	h.must(Event{Kind: EvDone, Key: Key{Room: 1}, Rank: 2})
	h.expectState(1, Transferring)
	h.expectErr(Event{Kind: EvDone, Key: Key{Room: 1}, Rank: 3}, ErrInvalidEvent)
	h.must(Event{Kind: EvDone, Key: Key{Room: 1}, Rank: 1})
	h.expectState(1, Success)
	if !h.has(EffNotifyPeer, 1, func(e Effect) bool { return e.Status == Success }) {
		t.Fatal("decode must tell prefill Success")
	}
	// A lost rank: the idle deadline fails the room instead of pinning it.
	h.must(Event{Kind: EvOpen, Key: Key{2, 43}, Peer: testPeer, Ranks: 2})
	h.must(ev(EvMetadata, 2, 43, testPeer))
	h.must(local(EvFirstChunk, 2))
	h.must(Event{Kind: EvDone, Key: Key{Room: 2}, Rank: 0})
	h.advance(idleT)
	h.expectState(2, Failed)
}

// R11 on prefill: a room fed by several decode ranks is WaitingForInput
// only once every decode rank's METADATA arrived (each prefill rank's Send
// must find its destination); a repeat does not count, one that names
// another count or a rank outside it is refused, and a lost one fails the
// room at its Bootstrapping deadline instead of pinning it.
func TestPrefillWaitsForEveryDecodeRanksMetadata_R11(t *testing.T) {
	h := newHarness(t, Prefill)
	h.must(open(1, 0, NoPeer))
	meta := func(room RoomID, nonce Nonce, rank uint8) Event {
		return Event{Kind: EvMetadata, Key: Key{room, nonce}, Peer: testPeer, Ranks: 4, Addressed: 4, Rank: rank}
	}
	h.must(meta(1, 42, 0))
	h.must(meta(1, 42, 2))
	h.must(meta(1, 42, 2)) // a retransmit
	h.expectState(1, Bootstrapping)
	h.expectErr(Event{Kind: EvMetadata, Key: Key{1, 42}, Peer: testPeer, Ranks: 4, Addressed: 2, Rank: 1}, ErrInvalidEvent)
	h.expectErr(Event{Kind: EvMetadata, Key: Key{1, 42}, Peer: testPeer, Ranks: 4, Addressed: 4, Rank: 4}, ErrInvalidEvent)
	h.must(meta(1, 42, 1))
	h.expectState(1, Bootstrapping)
	h.must(meta(1, 42, 3))
	h.expectState(1, WaitingForInput)
	if info, _ := h.tab.Get(1); info.RanksDone != 0 || info.Ranks != 4 {
		t.Fatalf("room 1 after its METADATA: ranks %d done %b, want 4 and none done", info.Ranks, info.RanksDone)
	}
	// One decode rank's METADATA lost: the room never waits for input.
	h.must(open(2, 0, NoPeer))
	for _, r := range []uint8{0, 1, 3} {
		h.must(meta(2, 43, r))
	}
	h.advance(bootT)
	h.expectState(2, Failed)
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
