package conn

import (
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/pdlink/pdlink/pkg/poll"
)

// outboxPeer is a target for outbox tests.
type outboxPeer poll.PeerID

func (p outboxPeer) transmit([]byte) error { return nil }

func (p outboxPeer) PeerID() poll.PeerID { return poll.PeerID(p) }

// roomFrames is a count kept as frames come and go (a drain asks after
// every transition; it used to scan every frame under the lock the
// senders need, which with 100k rooms failing at once kept decoded's
// drain from finishing in its cap). It must equal a scan after any mix of
// add, ack, requeue, expiry, drop and peer cancel.
func TestOutboxRoomFramesMatchesAScan(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		o := newOutbox(time.Millisecond, 10*time.Millisecond, 1)
		now := int64(0)
		var taken []*pending
		for range rapid.IntRange(1, 200).Draw(t, "ops") {
			switch rapid.IntRange(0, 5).Draw(t, "op") {
			case 0:
				p := &pending{dest: outboxPeer(rapid.IntRange(1, 3).Draw(t, "peer")),
					key: poll.Key{Room: poll.RoomID(rapid.IntRange(0, 3).Draw(t, "room"))}, giveUp: now + rapid.Int64Range(0, 50e6).Draw(t, "giveUp")}
				p.seq = o.nextSeq()
				o.add(now, p)
			case 1:
				if p := o.take(uint64(rapid.IntRange(1, 200).Draw(t, "seq")), poll.PeerID(rapid.IntRange(1, 3).Draw(t, "from"))); p != nil {
					taken = append(taken, p)
				}
			case 2:
				if len(taken) > 0 {
					o.requeue(now, taken[len(taken)-1])
					taken = taken[:len(taken)-1]
				}
			case 3:
				now += rapid.Int64Range(0, 20e6).Draw(t, "advance")
				o.due(now)
			case 4:
				o.drop(uint64(rapid.IntRange(1, 200).Draw(t, "dropSeq")))
			case 5:
				o.cancelPeer(poll.PeerID(rapid.IntRange(1, 3).Draw(t, "cancel")))
			}
			o.mu.Lock()
			want := 0
			for _, p := range o.items {
				if p.key.Room != 0 {
					want++
				}
			}
			o.mu.Unlock()
			if got := o.roomFrames(); got != want {
				t.Fatalf("roomFrames %d, a scan counts %d", got, want)
			}
		}
	})
}
