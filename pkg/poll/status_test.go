package poll

import "testing"

// PollStatus shows the nonce in every state and the reasons (the peer's
// too) only once Failed is visible (I9).
func TestPollStatusCarriesNonceAlwaysAndReasonsOnceVisible(t *testing.T) {
	h := newHarness(t, Decode)
	h.must(open(1, 42, testPeer))
	h.must(open(2, 43, testPeer))
	h.must(Event{Kind: EvPeerStatus, Key: Key{2, 43}, Peer: testPeer, Reason: ReasonCollision})
	got := h.tab.PollStatus([]RoomID{1, 2, 3}, nil)
	if got[0] != (Status{State: Bootstrapping, Nonce: 42}) {
		t.Fatalf("live room: %+v", got[0])
	}
	if got[1] != (Status{State: Bootstrapping, Nonce: 43}) {
		t.Fatalf("failed room before its fence: %+v, want its previous state and no reason", got[1])
	}
	if got[2] != (Status{}) {
		t.Fatalf("unknown room: %+v", got[2])
	}
	if !h.has(EffTransition, 2, func(e Effect) bool { return e.To == Failed && e.PeerReason == ReasonCollision }) {
		t.Fatalf("hidden transition lacks the peer reason:\n%s", formatEffects(h.effects))
	}
	h.must(Event{Kind: EvFenced, Key: Key{2, 43}})
	if !h.has(EffPublish, 2, func(e Effect) bool { return e.Reason == ReasonAbortedRemote && e.PeerReason == ReasonCollision }) {
		t.Fatalf("publish lacks the peer reason:\n%s", formatEffects(h.effects))
	}
	got = h.tab.PollStatus([]RoomID{2}, got)
	if want := (Status{State: Failed, Nonce: 43, Reason: ReasonAbortedRemote, PeerReason: ReasonCollision}); got[0] != want {
		t.Fatalf("fenced failed room: %+v, want %+v", got[0], want)
	}
}

// R5: a collision counts on the side that detects it (a peer frame for
// another nonce of a held room id) and on the side told of it.
func TestCollisionIsCountedWhereDetectedAndWhereTold_R5(t *testing.T) {
	pre := newHarness(t, Prefill)
	pre.must(open(1, 42, NoPeer))
	pre.expectErr(ev(EvMetadata, 1, 43, testPeer), ErrNonceMismatch)
	pre.expectErr(Event{Kind: EvAbortRemote, Key: Key{1, 43}, Peer: testPeer, Reason: ReasonTimeoutBootstrapping}, ErrNonceMismatch)
	if s := pre.tab.Stats(pre.now); s.Collisions != 1 {
		t.Fatalf("prefill collisions %d, want 1 (the METADATA, not the other request's abort)", s.Collisions)
	}

	dec := newHarness(t, Decode)
	dec.must(open(1, 43, testPeer))
	dec.must(Event{Kind: EvPeerStatus, Key: Key{1, 43}, Peer: testPeer, Reason: ReasonCollision})
	dec.must(open(2, 44, testPeer))
	dec.must(Event{Kind: EvAbortLocal, Key: Key{Room: 2}, Reason: ReasonCollision}) // prefill rejected it as foreign_room
	dec.must(open(3, 45, testPeer))
	dec.must(Event{Kind: EvPeerStatus, Key: Key{3, 45}, Peer: testPeer, Reason: ReasonTimeoutWaitingForInput})
	if s := dec.tab.Stats(dec.now); s.Collisions != 2 {
		t.Fatalf("decode collisions %d, want 2", s.Collisions)
	}
}
