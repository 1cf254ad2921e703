package poll

// move is one cell of the move table.
type move struct {
	legal  bool
	to     State // target state (for EvDone: the target once every rank is done)
	remove bool  // EvClear: the room leaves the table
	rebind bool  // EvPeerReplaced: the room moves to Event.NewPeer
}

// failKinds fail a live room.
var failKinds = [...]EventKind{EvPeerStatus, EvAbortLocal, EvAbortRemote, EvTimeout, EvPeerLost, EvPeerRestarted, EvShutdown, EvPeerReplaced}

// moves is THE table of legal moves (I2): moves[state][event]. Every cell
// not set here is illegal. EvOpen never appears: it applies to absent rooms
// only. Nothing is decided by comparing state numbers.
var moves = func() (m [numStates][numEventKinds]move) {
	m[Bootstrapping][EvMetadata] = move{legal: true, to: WaitingForInput}
	m[WaitingForInput][EvFirstChunk] = move{legal: true, to: Transferring}
	m[Transferring][EvFirstChunk] = move{legal: true, to: Transferring} // another rank's first chunk
	m[Transferring][EvProgress] = move{legal: true, to: Transferring}
	m[Transferring][EvDone] = move{legal: true, to: Success} // stays Transferring until every rank is done
	for _, s := range [...]State{Bootstrapping, WaitingForInput, Transferring} {
		for _, k := range failKinds {
			m[s][k] = move{legal: true, to: Failed}
		}
	}
	// A prefill restart (decode's EvPeerReplaced). On decode,
	// Bootstrapping means no APPLIED ack and no byte came from the old
	// instance: it never applied the METADATA, or did and its state died
	// with it (the ACK was lost). The new instance either never saw the
	// room (a METADATA that reached it before it knew us was answered
	// unknown_peer and created nothing, I3) or applied it after our
	// REGISTER, and then its APPLIED ack, which follows the restart, binds
	// the room to it. So the room moves to the new instance and its
	// METADATA goes again. From WaitingForInput on, the old instance held
	// the room and that state is lost: Failed (R10).
	m[Bootstrapping][EvPeerReplaced] = move{legal: true, to: Bootstrapping, rebind: true}
	m[Failed][EvFenced] = move{legal: true, to: Failed}
	m[Success][EvClear] = move{legal: true, remove: true}
	m[Failed][EvClear] = move{legal: true, remove: true} // once fenced
	return m
}()

// Legal reports whether the move table allows event k in state s, and the
// target state. Exported for tests and documentation tools.
func Legal(s State, k EventKind) (to State, ok bool) {
	if int(s) >= numStates || int(k) >= numEventKinds {
		return StateNone, false
	}
	m := moves[s][k]
	return m.to, m.legal
}

// failureReason returns the local reason for a failing event, and the
// peer's reason kept for information.
func failureReason(from State, ev *Event) (local, peer reasonCode) {
	switch ev.Kind {
	case EvTimeout:
		return timeoutReason(from), codeNone
	case EvAbortLocal:
		if ev.Reason == ReasonNone {
			return codeAbortedLocal, codeNone
		}
		c, _ := codeOf(ev.Reason)
		return c, codeNone
	case EvAbortRemote, EvPeerStatus:
		c, _ := codeOf(ev.Reason)
		return codeAbortedRemote, c
	case EvPeerLost:
		return codePeerLost, codeNone
	case EvPeerRestarted, EvPeerReplaced:
		return codePeerRestarted, codeNone
	case EvShutdown:
		return codeShutdown, codeNone
	}
	return codeAbortedLocal, codeNone
}

// notifiesPeer reports whether a failure caused by kind must be told to the
// peer (I9, R8): local causes yes; the peer's own abort or its loss, no.
func notifiesPeer(k EventKind) bool {
	switch k {
	case EvTimeout, EvAbortLocal, EvShutdown:
		return true
	}
	return false
}

// apply checks ev against the move table and applies it to r. It is the
// only code that changes a room's state after Open.
func (t *Table) apply(now int64, r *room, ev *Event) error {
	if ev.Kind == EvClear && !r.visible.Terminal() {
		// Only rooms the scheduler sees as terminal may be cleared.
		t.reject(rejNotTerminal)
		return ErrNotTerminal
	}
	m := moves[r.state][ev.Kind]
	if !m.legal {
		if r.state.Terminal() {
			t.reject(rejTerminal)
			t.echoTerminal(r, ev)
			return ErrTerminal
		}
		t.reject(rejIllegal)
		return ErrIllegalTransition
	}
	switch {
	case m.remove:
		t.remove(now, r, EffRemoved, codeNone)
		return nil
	case ev.Kind == EvFenced:
		if !r.fenced {
			r.fenced, r.visible = true, Failed
			t.emit(Effect{Kind: EffPublish, Key: r.key, Peer: r.peer, Status: Failed, Reason: r.reason.reason(), PeerReason: r.peerReason.reason(), At: now})
		}
		return nil
	case m.to == Failed:
		local, peer := failureReason(r.state, ev)
		if r.key.Nonce == 0 && ev.Key.Nonce != 0 {
			r.key.Nonce = ev.Key.Nonce
		}
		r.peerReason = peer
		if local == codeCollision || peer == codeCollision {
			t.ctr.collisions++ // told: the peer (or its ACK) says another request holds the id
		}
		t.fail(now, r, local, notifiesPeer(ev.Kind))
		return nil
	case ev.Kind == EvMetadata:
		if ev.Ranks != 0 && r.ranks != 0 && ev.Ranks != r.ranks {
			t.reject(rejInvalid)
			return ErrInvalidEvent
		}
		if ev.Ranks != 0 {
			r.ranks = ev.Ranks
		}
		if r.key.Nonce == 0 {
			r.key.Nonce = ev.Key.Nonce
		}
		if r.peer == NoPeer && ev.Peer != NoPeer {
			r.peer = ev.Peer
			t.linkPeer(r)
		}
		if ev.Addressed > 1 || r.addressed > 1 {
			if (r.addressed != 0 && ev.Addressed != r.addressed) || ev.Rank >= ev.Addressed {
				t.reject(rejInvalid)
				return ErrInvalidEvent
			}
			r.addressed = ev.Addressed
			r.ranksDone |= uint64(1) << ev.Rank
			if r.ranksDone != maskOf(int(r.addressed)) {
				t.q.Touch(&r.entry, now) // one decode rank's METADATA: progress, not yet bound whole
				return nil
			}
			r.ranksDone = 0 // every decode rank's METADATA is in: from now on, the ranks done
		}
	case ev.Kind == EvDone:
		if int(ev.Rank) >= r.expectedRanks() {
			t.reject(rejInvalid)
			return ErrInvalidEvent
		}
		bit := uint64(1) << ev.Rank
		if r.ranksDone&bit != 0 {
			return nil // duplicate rank: idempotent
		}
		r.ranksDone |= bit
		if !r.allRanksDone() {
			t.q.Touch(&r.entry, now) // a finished rank is progress
			return nil
		}
	}
	if m.to == r.state {
		t.q.Touch(&r.entry, now) // Transferring self-loop: refresh idle deadline
		return nil
	}
	t.become(now, r, m.to, codeNone)
	return nil
}

// become moves r to a new non-failed state and emits the transition.
func (t *Table) become(now int64, r *room, to State, reason reasonCode) {
	from, entered := r.state, r.enteredAt
	r.state, r.visible, r.enteredAt = to, to, now
	t.q.Move(&r.entry, classOf[to], now)
	r.record(t.cfg.HistoryLen, now, from, to, reason)
	t.ctr.transitions[from][to]++
	t.emit(Effect{Kind: EffTransition, Key: r.key, Peer: r.peer, From: from, To: to, Visible: true, At: now,
		Opened: r.createdAt, Entered: entered})
	if to == Success {
		t.unlinkPeer(r)
		if t.cfg.Side == Decode && r.peer != NoPeer {
			t.emit(Effect{Kind: EffNotifyPeer, Key: r.key, Peer: r.peer, Status: Success, At: now})
		}
	}
}

// fail moves a live room to Failed. The scheduler keeps seeing the previous
// state until the driver fences the room (I9).
func (t *Table) fail(now int64, r *room, reason reasonCode, notify bool) {
	from, entered := r.state, r.enteredAt
	r.state, r.enteredAt, r.reason, r.fenced = Failed, now, reason, false
	t.unlinkPeer(r)
	t.q.Move(&r.entry, classOf[Failed], now)
	r.record(t.cfg.HistoryLen, now, from, Failed, reason)
	t.ctr.transitions[from][Failed]++
	t.ctr.failures[reason]++
	t.emit(Effect{Kind: EffTransition, Key: r.key, Peer: r.peer, From: from, To: Failed, Reason: reason.reason(), PeerReason: r.peerReason.reason(), At: now,
		Opened: r.createdAt, Entered: entered})
	t.emit(Effect{Kind: EffFence, Key: r.key, Peer: r.peer, At: now})
	if notify && r.peer != NoPeer {
		t.emit(Effect{Kind: EffNotifyPeer, Key: r.key, Peer: r.peer, Status: Failed, Reason: reason.reason(), At: now})
	}
}

// echoTerminal answers a peer's frame about a room that already ended here
// with the room's outcome, so the peer does not wait for its own deadline
// (R3). Failures from the peer need no answer.
func (t *Table) echoTerminal(r *room, ev *Event) {
	if ev.Peer == NoPeer || ev.Kind == EvAbortRemote || ev.Kind == EvPeerStatus {
		return
	}
	k := ev.Key
	if k.Nonce == 0 {
		k.Nonce = r.key.Nonce
	}
	t.emit(Effect{Kind: EffNotifyPeer, Key: k, Peer: ev.Peer, Status: r.state, Reason: r.reason.reason(), At: t.now})
}
