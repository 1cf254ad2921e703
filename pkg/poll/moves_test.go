package poll

import (
	"errors"
	"fmt"
	"testing"
)

// start names the state a room is driven to before the event under test.
type start uint8

const (
	inBootstrapping start = iota
	inWaiting
	inTransferring
	inSuccess
	inFailedUnfenced
	inFailedFenced
)

var startNames = [...]string{"Bootstrapping", "WaitingForInput", "Transferring", "Success", "Failed(unfenced)", "Failed(fenced)"}

// reach opens room 1 (nonce 42, peer 7) on decode and drives it to s.
func reach(t *testing.T, s start) *harness {
	h := newHarness(t, Decode)
	h.must(open(1, 42, testPeer))
	if s == inFailedUnfenced || s == inFailedFenced {
		h.must(local(EvAbortLocal, 1))
		if s == inFailedFenced {
			h.must(local(EvFenced, 1))
		}
		h.take()
		return h
	}
	steps := []Event{ev(EvMetadata, 1, 42, testPeer), local(EvFirstChunk, 1), local(EvDone, 1)}
	for _, e := range steps[:int(s)] {
		h.must(e)
	}
	h.take()
	return h
}

// outcome is what the test expects an event to do.
type outcome struct {
	to  State // resulting internal state; StateNone: removed
	err error // nil: accepted
}

var (
	toB   = outcome{to: Bootstrapping}
	toW   = outcome{to: WaitingForInput}
	toT   = outcome{to: Transferring}
	toS   = outcome{to: Success}
	toF   = outcome{to: Failed}
	gone  = outcome{to: StateNone}
	illeg = outcome{err: ErrIllegalTransition}
	term  = outcome{err: ErrTerminal}
	notT  = outcome{err: ErrNotTerminal}
)

// kindsUnderTest are every event kind a room can receive. EvTimeout is
// produced by advancing time past the state's deadline.
var kindsUnderTest = []EventKind{EvMetadata, EvFirstChunk, EvProgress, EvDone, EvPeerStatus, EvAbortLocal,
	EvAbortRemote, EvTimeout, EvPeerLost, EvPeerRestarted, EvFenced, EvClear, EvShutdown, EvPeerReplaced}

// expected is written out by hand, independently of moves.go: a change to
// the move table that is not mirrored here fails the test.
var expected = map[start]map[EventKind]outcome{
	inBootstrapping: {EvMetadata: toW, EvFirstChunk: illeg, EvProgress: illeg, EvDone: illeg,
		EvPeerStatus: toF, EvAbortLocal: toF, EvAbortRemote: toF, EvTimeout: toF, EvPeerLost: toF,
		EvPeerRestarted: toF, EvFenced: illeg, EvClear: notT, EvShutdown: toF, EvPeerReplaced: toB},
	inWaiting: {EvMetadata: illeg, EvFirstChunk: toT, EvProgress: illeg, EvDone: illeg,
		EvPeerStatus: toF, EvAbortLocal: toF, EvAbortRemote: toF, EvTimeout: toF, EvPeerLost: toF,
		EvPeerRestarted: toF, EvFenced: illeg, EvClear: notT, EvShutdown: toF, EvPeerReplaced: toF},
	inTransferring: {EvMetadata: illeg, EvFirstChunk: toT, EvProgress: toT, EvDone: toS,
		EvPeerStatus: toF, EvAbortLocal: toF, EvAbortRemote: toF, EvTimeout: toF, EvPeerLost: toF,
		EvPeerRestarted: toF, EvFenced: illeg, EvClear: notT, EvShutdown: toF, EvPeerReplaced: toF},
	// Peer loss and shutdown only touch live rooms: on a terminal room they
	// are no-ops (the room keeps its state), not rejections. The linger
	// deadline reaps a terminal room.
	inSuccess: {EvMetadata: term, EvFirstChunk: term, EvProgress: term, EvDone: term,
		EvPeerStatus: term, EvAbortLocal: term, EvAbortRemote: term, EvTimeout: gone, EvPeerLost: toS,
		EvPeerRestarted: toS, EvFenced: term, EvClear: gone, EvShutdown: toS, EvPeerReplaced: toS},
	inFailedUnfenced: {EvMetadata: term, EvFirstChunk: term, EvProgress: term, EvDone: term,
		EvPeerStatus: term, EvAbortLocal: term, EvAbortRemote: term, EvTimeout: gone, EvPeerLost: toF,
		EvPeerRestarted: toF, EvFenced: toF, EvClear: notT, EvShutdown: toF, EvPeerReplaced: toF},
	inFailedFenced: {EvMetadata: term, EvFirstChunk: term, EvProgress: term, EvDone: term,
		EvPeerStatus: term, EvAbortLocal: term, EvAbortRemote: term, EvTimeout: gone, EvPeerLost: toF,
		EvPeerRestarted: toF, EvFenced: toF, EvClear: gone, EvShutdown: toF, EvPeerReplaced: toF},
}

// eventFor builds a well-formed event of kind k for room 1.
func eventFor(k EventKind) Event {
	switch k {
	case EvMetadata, EvPeerStatus, EvAbortRemote:
		return ev(k, 1, 42, testPeer)
	case EvPeerLost, EvPeerRestarted:
		return Event{Kind: k, Peer: testPeer}
	case EvPeerReplaced:
		return Event{Kind: k, Peer: testPeer, NewPeer: otherPeer}
	case EvShutdown:
		return Event{Kind: k}
	}
	return local(k, 1)
}

// timeoutOf is how long to wait to hit the deadline of a start state.
func timeoutOf(s start) int64 {
	switch s {
	case inBootstrapping:
		return at(bootT)
	case inWaiting:
		return at(waitT)
	case inTransferring:
		return at(idleT)
	}
	return at(lingerT)
}

func TestEveryStateEventPair(t *testing.T) {
	for s := inBootstrapping; s <= inFailedFenced; s++ {
		for _, k := range kindsUnderTest {
			want, ok := expected[s][k]
			if !ok {
				t.Fatalf("no expectation for %s x %v", startNames[s], k)
			}
			t.Run(fmt.Sprintf("%s/%v", startNames[s], k), func(t *testing.T) {
				h := reach(t, s)
				before := h.state(1)
				rejBefore := h.tab.Stats(h.now).RejectedTotal()
				var err error
				if k == EvTimeout {
					h.now += timeoutOf(s)
					h.tab.Tick(h.now)
					h.collect()
				} else {
					err = h.step(eventFor(k))
				}
				rej := h.tab.Stats(h.now).RejectedTotal() - rejBefore
				if want.err != nil {
					if !errors.Is(err, want.err) {
						t.Fatalf("got err %v, want %v", err, want.err)
					}
					if got := h.state(1); got != before {
						t.Fatalf("rejected event changed state %v -> %v", before, got)
					}
					if rej != 1 {
						t.Fatalf("rejection counted %d times, want 1", rej)
					}
					return
				}
				if err != nil {
					t.Fatalf("unexpected error %v", err)
				}
				if rej != 0 {
					t.Fatalf("accepted event counted as rejected")
				}
				if got := h.state(1); got != want.to {
					t.Fatalf("state %v, want %v", got, want.to)
				}
			})
		}
	}
}

// TestMoveTableHasNoExitFromTerminal_I1 reads the table itself: no event
// leads out of Success or Failed.
func TestMoveTableHasNoExitFromTerminal_I1(t *testing.T) {
	for _, s := range []State{Success, Failed} {
		for k := EventKind(0); int(k) < numEventKinds; k++ {
			if to, ok := Legal(s, k); ok && to != s && to != StateNone {
				t.Errorf("%v --%v--> %v leaves a terminal state", s, k, to)
			}
		}
	}
}

func TestFailureReasonsPerEvent(t *testing.T) {
	cases := []struct {
		name  string
		event Event
		want  Reason
		peerR Reason
	}{
		{"abort local default", local(EvAbortLocal, 1), ReasonAbortedLocal, ""},
		{"abort local checksum", Event{Kind: EvAbortLocal, Key: Key{Room: 1}, Reason: ReasonChecksum}, ReasonChecksum, ""},
		{"abort remote", Event{Kind: EvAbortRemote, Key: Key{1, 42}, Peer: testPeer, Reason: ReasonTimeoutWaitingForInput}, ReasonAbortedRemote, ReasonTimeoutWaitingForInput},
		{"peer status", Event{Kind: EvPeerStatus, Key: Key{1, 42}, Peer: testPeer, Reason: ReasonChecksum}, ReasonAbortedRemote, ReasonChecksum},
		{"peer lost", Event{Kind: EvPeerLost, Peer: testPeer}, ReasonPeerLost, ""},
		{"peer restarted", Event{Kind: EvPeerRestarted, Peer: testPeer}, ReasonPeerRestarted, ""},
		{"peer replaced", Event{Kind: EvPeerReplaced, Peer: testPeer, NewPeer: otherPeer}, ReasonPeerRestarted, ""},
		{"shutdown", Event{Kind: EvShutdown}, ReasonShutdown, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := reach(t, inTransferring)
			h.must(tc.event)
			info, _ := h.tab.Get(1)
			if info.Reason != tc.want || info.PeerReason != tc.peerR {
				t.Fatalf("reason %q peer reason %q, want %q %q", info.Reason, info.PeerReason, tc.want, tc.peerR)
			}
			if s := h.tab.Stats(h.now); s.Failures(tc.want) != 1 {
				t.Fatalf("failure not counted under %q", tc.want)
			}
		})
	}
}

func TestMalformedEventsAreRejected(t *testing.T) {
	cases := map[string]Event{
		"unknown kind":           {Kind: EventKind(200), Key: Key{Room: 1}},
		"zero kind":              {Key: Key{Room: 1}},
		"external timeout":       local(EvTimeout, 1),
		"metadata without nonce": ev(EvMetadata, 1, 0, testPeer),
		"abort remote no nonce":  ev(EvAbortRemote, 1, 0, testPeer),
		"reason not in set":      {Kind: EvAbortLocal, Key: Key{Room: 1}, Reason: "oops"},
		"uncleared as failure":   {Kind: EvAbortLocal, Key: Key{Room: 1}, Reason: ReasonUncleared},
		"reason on progress":     {Kind: EvProgress, Key: Key{Room: 1}, Reason: ReasonChecksum},
		"too many ranks":         {Kind: EvOpen, Key: Key{Room: 2}, Ranks: 65},
		"room id over 63 bits":   open(1<<63, 1, NoPeer),
		"peer lost without peer": {Kind: EvPeerLost},
		"replaced without peer":  {Kind: EvPeerReplaced, NewPeer: otherPeer},
		"replaced by nobody":     {Kind: EvPeerReplaced, Peer: testPeer},
		"replaced by itself":     {Kind: EvPeerReplaced, Peer: testPeer, NewPeer: testPeer},
		"new peer on peer lost":  {Kind: EvPeerLost, Peer: testPeer, NewPeer: otherPeer},
	}
	for name, e := range cases {
		t.Run(name, func(t *testing.T) {
			h := reach(t, inTransferring)
			h.expectErr(e, ErrInvalidEvent)
			h.expectState(1, Transferring)
			if s := h.tab.Stats(h.now); s.Rejected(RejectInvalid) != 1 {
				t.Fatal("not counted as invalid")
			}
		})
	}
}
