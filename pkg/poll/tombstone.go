package poll

import "github.com/pdlink/pdlink/pkg/inflight"

// tombKind says what a tombstone remembers.
type tombKind uint8

const (
	// tombAbort: an abort arrived before the room was opened (I4).
	tombAbort tombKind = iota
	// tombEnded: the room was cleared or reaped; late frames get its
	// outcome (R2, R3).
	tombEnded
)

// tomb is a tombstone. Tombstones of one room id form a chain of at most two
// (one abort, one ended); all of
// them sit in one inflight queue (one class per kind, both with the TTL),
// which gives TTL expiry and oldest-first eviction in O(1).
type tomb struct {
	key        Key
	kind       tombKind
	state      State // tombEnded: the room's final state
	reason     reasonCode
	peerReason reasonCode
	entry      inflight.Entry[*tomb]
	next       *tomb
}

// nonceCompatible: a zero nonce on either side matches any nonce.
func nonceCompatible(a, b Nonce) bool { return a == 0 || b == 0 || a == b }

// takeAborts removes every abort tombstone a new Open of k matches (same
// key, or same room id when either side carries no nonce) and returns a
// copy of the oldest one (the first cause wins), or ok=false.
func (t *Table) takeAborts(k Key) (first tomb, ok bool) {
	for tb := t.tombs[k.Room]; tb != nil; {
		next := tb.next
		if tb.kind == tombAbort && nonceCompatible(tb.key.Nonce, k.Nonce) {
			first, ok = *tb, true // the chain is newest first
			t.removeTomb(tb)
		}
		tb = next
	}
	first.next = nil
	return first, ok
}

// findEnded returns the ended tombstone for k; exact requires the same
// non-zero nonce.
func (t *Table) findEnded(k Key, exact bool) *tomb {
	for tb := t.tombs[k.Room]; tb != nil; tb = tb.next {
		if tb.kind != tombEnded {
			continue
		}
		if exact && tb.key.Nonce == k.Nonce && k.Nonce != 0 || !exact && nonceCompatible(tb.key.Nonce, k.Nonce) {
			return tb
		}
	}
	return nil
}

// addAbort records an abort for a room not yet opened (I4). A second abort
// for the same key keeps the first; an abort for the same room id with
// another nonce replaces it (at most one abort tombstone per room id, so
// chains stay short whatever a peer sends).
func (t *Table) addAbort(now int64, k Key, reason, peerReason reasonCode) {
	for tb := t.tombs[k.Room]; tb != nil; tb = tb.next {
		if tb.kind == tombAbort {
			if tb.key == k {
				return
			}
			t.removeTomb(tb)
			break
		}
	}
	tb := t.newTomb(now, k, tombAbort)
	tb.reason, tb.peerReason = reason, peerReason
	t.ctr.abortTombs++
}

// addEnded records that r left the table, replacing the ended tombstone of
// an earlier room with the same id (at most one per room id: a late frame
// of an older request is still refused by the nonce check or, for an
// unbound room, answered NotOpen and covered by the peer's deadline).
func (t *Table) addEnded(now int64, r *room) {
	for tb := t.tombs[r.key.Room]; tb != nil; tb = tb.next {
		if tb.kind == tombEnded {
			t.removeTomb(tb)
			break
		}
	}
	tb := t.newTomb(now, r.key, tombEnded)
	tb.state, tb.reason, tb.peerReason = r.state, r.reason, r.peerReason
}

// newTomb links a tombstone, evicting the oldest one past MaxTombstones.
func (t *Table) newTomb(now int64, k Key, kind tombKind) *tomb {
	for t.tq.Len() >= t.cfg.MaxTombstones {
		a, b := t.tq.Oldest(0), t.tq.Oldest(1)
		victim := a
		if victim == nil || b != nil && b.EnteredAt() < a.EnteredAt() {
			victim = b
		}
		t.ctr.tombsEvicted++
		t.removeTomb(victim.Value)
	}
	var tb *tomb
	if n := len(t.freeTombs); n > 0 {
		tb = t.freeTombs[n-1]
		t.freeTombs = t.freeTombs[:n-1]
	} else {
		tb = &tomb{}
		tb.entry.Value = tb
	}
	tb.key, tb.kind = k, kind
	tb.next = t.tombs[k.Room]
	t.tombs[k.Room] = tb
	t.tq.Push(&tb.entry, inflight.Class(kind), now)
	return tb
}

// removeTomb unlinks a tombstone from its chain and the queue.
func (t *Table) removeTomb(tb *tomb) {
	head := t.tombs[tb.key.Room]
	if head == tb {
		if tb.next == nil {
			delete(t.tombs, tb.key.Room)
		} else {
			t.tombs[tb.key.Room] = tb.next
		}
	} else {
		for p := head; p != nil; p = p.next {
			if p.next == tb {
				p.next = tb.next
				break
			}
		}
	}
	t.tq.Remove(&tb.entry)
	*tb = tomb{}
	if len(t.freeTombs) < maxFree {
		tb.entry.Value = tb
		t.freeTombs = append(t.freeTombs, tb)
	}
}
