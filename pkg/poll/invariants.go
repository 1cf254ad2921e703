package poll

import (
	"errors"
	"fmt"
)

// CheckInvariants verifies that every table agrees (I6) and that no room or
// tombstone is past its deadline (I5, I7). It is O(n) and meant for tests
// and debug endpoints.
func (t *Table) CheckInvariants() error {
	if err := t.q.Check(); err != nil {
		return fmt.Errorf("inflight queue: %w", err)
	}
	if err := t.tq.Check(); err != nil {
		return fmt.Errorf("tombstone queue: %w", err)
	}
	if t.q.Len() != len(t.rooms) {
		return fmt.Errorf("I6: %d rooms in the map, %d in the inflight queue", len(t.rooms), t.q.Len())
	}
	live := 0
	for id, r := range t.rooms {
		if r.key.Room != id {
			return fmt.Errorf("I6: room %v filed under id %d", r.key, id)
		}
		if !r.entry.Queued() || r.entry.Class() != classOf[r.state] || r.entry.Value != r {
			return fmt.Errorf("I6: room %v in state %v not queued in its class", r.key, r.state)
		}
		switch {
		case r.state == StateNone || int(r.state) >= numStates:
			return fmt.Errorf("room %v has no state", r.key)
		case r.state == Failed && !r.fenced && r.visible.Terminal():
			return fmt.Errorf("I9: room %v visible %v before fence", r.key, r.visible)
		case r.state != Failed && r.visible != r.state, r.state == Failed && r.fenced && r.visible != Failed:
			return fmt.Errorf("room %v: visible %v, state %v", r.key, r.visible, r.state)
		}
		if t.q.Deadline(&r.entry) <= t.now {
			return fmt.Errorf("I5/I7: room %v in %v past its deadline", r.key, r.state)
		}
		if !r.state.Terminal() && r.peer != NoPeer {
			live++
		}
		if r.state.Terminal() && (r.peerPrev != nil || r.peerNext != nil || t.peers[r.peer] == r) {
			return fmt.Errorf("I6: terminal room %v still in the peer index", r.key)
		}
	}
	indexed := 0
	for p, head := range t.peers {
		if head == nil || head.peerPrev != nil {
			return fmt.Errorf("I6: peer %d: bad list head", p)
		}
		for r := head; r != nil; r = r.peerNext {
			if r.peer != p || r.state.Terminal() || t.rooms[r.key.Room] != r {
				return fmt.Errorf("I6: peer %d lists room %v (peer %d, %v) not live in the table", p, r.key, r.peer, r.state)
			}
			if r.peerNext != nil && r.peerNext.peerPrev != r {
				return fmt.Errorf("I6: peer %d: broken list", p)
			}
			indexed++
		}
	}
	if indexed != live {
		return fmt.Errorf("I6: %d live rooms bound to peers, %d in the peer index", live, indexed)
	}
	tombs := 0
	for id, head := range t.tombs {
		if head == nil {
			return fmt.Errorf("I6: empty tombstone chain for %d", id)
		}
		for tb := head; tb != nil; tb = tb.next {
			if tb.key.Room != id || !tb.entry.Queued() || tb.entry.Value != tb {
				return fmt.Errorf("I6: tombstone %v not consistent", tb.key)
			}
			if tb.kind == tombAbort {
				if r := t.rooms[id]; r != nil && r.key == tb.key {
					return fmt.Errorf("I4: abort tombstone %v beside its open room", tb.key)
				}
			}
			if t.tq.Deadline(&tb.entry) <= t.now {
				return fmt.Errorf("I4: tombstone %v past its TTL", tb.key)
			}
			tombs++
		}
	}
	if tombs != t.tq.Len() {
		return fmt.Errorf("I6: %d tombstones chained, %d queued", tombs, t.tq.Len())
	}
	if tombs > t.cfg.MaxTombstones {
		return errors.New("I4: tombstones over the cap")
	}
	return nil
}
