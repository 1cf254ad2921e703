package room

import (
	"math/bits"

	"github.com/pdlink/pdlink/pkg/poll"
)

// Decode's prefix on prefill (RoomStatus.prefix_len). Each decode rank's
// METADATA says how many leading positions that rank holds; the data plane
// keeps it per share (prefillRoom.prefix), but the scheduler needs it for
// the room, in the same answers as the room's state: the WaitingForInput
// transition published while the binding METADATA is stepped, Poll, and
// the calls' answers. So the owner keeps it beside the table, per room:
// the fewest positions any decode rank holds, since a Send that skips more
// than one share's prefix is refused for that share. Only rooms with a
// prefix (and multi-rank rooms still collecting METADATA) have an entry:
// a room without one costs nothing.

// roomPrefix is decode's prefix of one room as its METADATA frames gave it.
type roomPrefix struct {
	key  poll.Key
	len  uint32
	seen uint64 // bit i: decode rank i's METADATA is in
	want uint8  // decode ranks addressing this daemon (1..poll.MaxRanks)
}

func (p roomPrefix) complete() bool { return bits.OnesCount64(p.seen) >= int(p.want) }

// notePrefixLocked records md's prefix before the METADATA is stepped, so
// the transition that step publishes carries it. Only a room that exists
// here, is Bootstrapping and can take md's nonce gets an entry: a frame
// about an unknown room creates nothing (I3). A frame the step then
// refuses leaves its value in (min only lowers it: at worst the scheduler
// sends pages decode holds, which stays legal). Inside withTable.
func (c *core) notePrefixLocked(md Metadata) {
	want := uint8(min(max(md.Rank.Size, 1), poll.MaxRanks))
	if md.PrefixLen == 0 && want == 1 {
		return // the common room: nothing to keep
	}
	var st [1]poll.Status
	got := c.t.PollStatus([]poll.RoomID{md.Key.Room}, st[:0])
	if got[0].State != poll.Bootstrapping || got[0].Nonce != 0 && got[0].Nonce != md.Key.Nonce {
		return
	}
	p, ok := c.prefixes[md.Key.Room]
	if !ok || p.key != md.Key || p.want != want {
		p = roomPrefix{key: md.Key, len: md.PrefixLen, want: want}
	}
	p.len = min(p.len, md.PrefixLen)
	p.seen |= uint64(1) << min(md.Rank.TP, poll.MaxRanks-1)
	switch {
	case p.len == 0 && p.complete():
		delete(c.prefixes, md.Key.Room) // no prefix: the room needs no entry
	default:
		if c.prefixes == nil {
			c.prefixes = map[poll.RoomID]roomPrefix{}
		}
		c.prefixes[md.Key.Room] = p
	}
}

// prefixOfLocked is the room's prefix once every decode rank's METADATA
// is in (0 before, and for a room without one). Inside withTable.
func (c *core) prefixOfLocked(key poll.Key) uint32 {
	if c.prefixes == nil {
		return 0
	}
	if p, ok := c.prefixes[key.Room]; ok && p.key == key && p.complete() {
		return p.len
	}
	return 0
}

// dropPrefix forgets the prefix of a room that left the table: no room
// with its id is left, so whatever the entry's nonce, it is dead.
func (c *core) dropPrefix(k poll.Key) {
	if c.prefixes != nil {
		delete(c.prefixes, k.Room)
	}
}
