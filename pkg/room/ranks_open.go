package room

import (
	"fmt"

	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// One room per request per daemon, shared by every TP rank: each rank's
// scheduler process opens it with its own rank. The first Open creates the
// room; an Open from another rank of the same tp_size joins it (the same
// nonce; decode: the same prefill address and expected_senders, else
// InvalidArgument naming the field); the same rank opening it again is
// AlreadyExists. A room of tp_size 1 has no record: its Open is the
// table's, as before ranks.

// openRecord is which ranks opened a multi-rank room, and what its first
// Open asked for.
type openRecord struct {
	key    poll.Key
	size   uint16
	opened uint64 // bit i: rank i opened the room
	// addr and expected are decode's: the prefill daemon and the prefill
	// ranks the first Open named.
	addr     string
	expected int
}

// dropOpen forgets the record of a room that left the table.
func (c *core) dropOpen(k poll.Key) {
	if rec := c.opens[k.Room]; rec != nil && (rec.key.Nonce == 0 || k.Nonce == 0 || rec.key.Nonce == k.Nonce) {
		delete(c.opens, k.Room)
	}
}

// joinOwned joins rank to the multi-rank room id if a record holds it, in
// an owner input: joined false when there is none (the caller creates the
// room). check vets the joining Open against the first (decode's fields).
func (c *core) joinOwned(id poll.RoomID, rank transfer.Rank, check func(*openRecord) error) (rec *openRecord, joined bool, err error) {
	rec = c.opens[id]
	if rec == nil {
		return nil, false, nil
	}
	switch bit := uint64(1) << rank.TP; {
	case rank.Size != rec.size:
		return rec, true, invalid("rank", "tp_size %d: room %d was opened by ranks of tp_size %d", rank.Size, id, rec.size)
	case rec.opened&bit != 0:
		return rec, true, fmt.Errorf("%w: room %d: rank %d of %d opened it already", poll.ErrAlreadyExists, id, rank.TP, rank.Size)
	}
	if check != nil {
		if err := check(rec); err != nil {
			return rec, true, err
		}
	}
	rec.opened |= uint64(1) << rank.TP
	return rec, true, nil
}

// recordOwned records rank's Open that created the room key.
func (c *core) recordOwned(key poll.Key, rank transfer.Rank, addr string, expected int) {
	if c.opens == nil {
		c.opens = map[poll.RoomID]*openRecord{}
	}
	c.opens[key.Room] = &openRecord{key: key, size: rank.Size, opened: uint64(1) << rank.TP, addr: addr, expected: expected}
}

// OpenRank is Open for one rank's scheduler (OpenSender with rank): a
// rank of tp_size 1 opens as Open does; another rank joins the room its
// sibling created. The rank must have a region here.
func (n *PrefillOwner) OpenRank(room poll.RoomID, nonce poll.Nonce, r Rank) (poll.RoomInfo, error) {
	rank := transfer.Rank{TP: r.TP, Size: max(r.Size, 1)}
	if rank.Size == 1 {
		return n.Open(room, nonce, 0)
	}
	if n.lk.Closed() {
		return poll.RoomInfo{}, conn.ErrClosedNode
	}
	if err := conn.ValidateRank(Rank(rank).proto()); err != nil {
		return poll.RoomInfo{}, invalid("rank", "%v", err)
	}
	if n.data != nil {
		if err := n.data.slot.checkRank("rank", Rank(rank).proto()); err != nil {
			return poll.RoomInfo{}, err
		}
	}
	var err error
	n.exec(func() {
		var joined bool
		_, joined, err = n.joinOwned(room, rank, func(*openRecord) error {
			if nonce != 0 {
				var in poll.RoomInfo
				n.withTable(func() { in, _ = n.t.Get(room) })
				if in.Key.Nonce != 0 && in.Key.Nonce != nonce {
					return fmt.Errorf("%w: room %d is held by nonce %d", poll.ErrCollision, room, in.Key.Nonce)
				}
			}
			return nil
		})
		if joined || err != nil {
			return
		}
		key := poll.Key{Room: room, Nonce: nonce}
		n.applyOwned(func() { err = n.t.Step(n.now(), poll.Event{Kind: poll.EvOpen, Key: key}) })
		if err == nil {
			n.recordOwned(key, rank, "", 0)
		}
	})
	if err != nil {
		return poll.RoomInfo{}, err
	}
	return n.Get(room)
}

// OpenRank is Open for one rank's scheduler (OpenReceiver with rank): a
// rank of tp_size 1 opens as Open does; another rank joins the room its
// sibling created and gets the same nonce, provided it names the same
// prefill daemon and expected_senders. The room expects one completion
// per decode rank (its pages and aux row verified, from the prefill ranks
// the mapping feeds it from); prefill refuses a mapping it cannot serve.
func (n *DecodeOwner) OpenRank(room poll.RoomID, prefillAddr string, ranks int, r Rank) (poll.Nonce, error) {
	rank := transfer.Rank{TP: r.TP, Size: max(r.Size, 1)}
	if rank.Size == 1 {
		return n.Open(room, prefillAddr, ranks)
	}
	if n.lk.Closed() {
		return 0, conn.ErrClosedNode
	}
	if err := conn.ValidateRank(Rank(rank).proto()); err != nil {
		return 0, invalid("rank", "%v", err)
	}
	if n.data != nil {
		if err := n.data.slot.checkRank("rank", Rank(rank).proto()); err != nil {
			return 0, err
		}
	}
	ranks = max(ranks, 1)
	if prefillAddr == "" {
		return 0, fmt.Errorf("%w: address %q", conn.ErrBadArgument, prefillAddr)
	}
	var got poll.Nonce
	var err error
	join := func() (joined bool) {
		var rec *openRecord
		rec, joined, err = n.joinOwned(room, rank, func(rec *openRecord) error {
			switch {
			case rec.addr != prefillAddr:
				return invalid("prefill_bootstrap_addr", "%q: room %d was opened for %q", prefillAddr, room, rec.addr)
			case rec.expected != ranks:
				return invalid("expected_senders", "%d: room %d was opened expecting %d", ranks, room, rec.expected)
			}
			return nil
		})
		if joined && err == nil {
			got = rec.key.Nonce
		}
		return joined
	}
	// A sibling rank's room is joined before any session is made: a
	// joining Open that names another prefill daemon dials nothing.
	var joined bool
	n.exec(func() { joined = join() })
	if joined {
		return got, err
	}
	s, err := n.link.Session(prefillAddr)
	if err != nil {
		return 0, err
	}
	id := n.link.CurrentPeer(s)
	nonce := poll.Nonce(randomUint64())
	created := false
	n.exec(func() {
		if join() { // a sibling rank opened it meanwhile
			return
		}
		key := poll.Key{Room: room, Nonce: nonce}
		n.applyOwned(func() {
			// The room is Success once each of its own ranks completed (every
			// rank in its From delivered, rankmap): one completion per decode
			// rank, whatever the prefill ranks feeding it (MLA: one each).
			err = n.t.Step(n.now(), poll.Event{Kind: poll.EvOpen, Key: key, Peer: id, Ranks: uint8(rank.Size)})
		})
		if err == nil {
			n.recordOwned(key, rank, prefillAddr, ranks)
			got, created = nonce, true
		}
	})
	if err != nil {
		return 0, err
	}
	if current := n.link.CurrentPeer(s); created && current != id {
		// The prefill restarted between reading its id and the open, and
		// its rooms were moved before this one existed: move it too.
		_ = n.step(poll.Event{Kind: poll.EvPeerReplaced, Peer: id, NewPeer: current})
	}
	return got, nil
}
