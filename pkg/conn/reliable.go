package conn

import (
	"context"
	"maps"
	"math/rand/v2"
	"sync"
	"time"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
)

// AckResult is what an ACK said about a frame.
type AckResult struct {
	Result pdlinkv1.AckResult
	Reason string
}

var (
	// AckApplied: the frame took effect, or had already.
	AckApplied = AckResult{Result: pdlinkv1.AckResult_ACK_RESULT_APPLIED}
	// AckNotOpen: the room is not open here yet; the sender retries until
	// its own deadline.
	AckNotOpen = AckResult{Result: pdlinkv1.AckResult_ACK_RESULT_NOT_OPEN}
)

// AckRejected is the answer to a frame refused for reason r.
func AckRejected(r RejectReason) AckResult {
	return AckResult{Result: pdlinkv1.AckResult_ACK_RESULT_REJECTED, Reason: r.String()}
}

// final reports whether a sender must stop retrying after this answer, so
// the receiver may remember it in its dedupe window. NOT_OPEN and
// unknown_peer say "try again", and a retry must be processed again.
func (a AckResult) final() bool {
	switch a.Result {
	case pdlinkv1.AckResult_ACK_RESULT_NOT_OPEN:
		return false
	case pdlinkv1.AckResult_ACK_RESULT_REJECTED:
		return !a.unknownPeer()
	}
	return true
}

// unknownPeer reports whether the peer refused the frame because it does
// not know us (it restarted or forgot us): it goes again once we are
// registered.
func (a AckResult) unknownPeer() bool {
	return a.Result == pdlinkv1.AckResult_ACK_RESULT_REJECTED && a.Reason == RejectUnknownPeer.String()
}

// Target is where a frame goes: a peer instance on prefill, a prefill
// session on decode. The room side holds it only as an opaque handle the
// link gave it (to send replies with Send); transmit sends one copy, best
// effort.
type Target interface {
	transmit(frame []byte) error
	// PeerID is the peer the frame goes to (NoPeer: a dialer that is not
	// a registered peer).
	PeerID() poll.PeerID
}

// pending is one reliable frame waiting for its ACK.
type pending struct {
	seq     uint64
	ft      FrameType
	frame   []byte
	dest    Target
	key     poll.Key
	giveUp  int64 // node time (ns) after which the frame is abandoned
	next    int64 // next retransmit
	attempt int
	// want, if set, is asked before each retransmit; false drops the frame
	// (its room moved on).
	want func() bool
	// onAck handles the ACK from the peer instance it went to; it returns
	// false to keep retrying (NOT_OPEN). nil: any ACK completes the frame.
	onAck func(from poll.PeerID, a AckResult) bool
	// afterRegister: the frame goes again as soon as its peer acknowledges
	// our REGISTER (besides its backoff): its room moved to a restarted
	// peer's new instance, which knows nothing of us until then.
	afterRegister bool
}

// outbox holds a node's unacknowledged frames and draws their sequence
// numbers (one counter per instance and epoch, so (sender, epoch, seq) is
// unique). Retransmits back off exponentially with jitter, from RetryBase
// up to RetryMax, until the ACK or the frame's give-up deadline.
type outbox struct {
	base, max time.Duration

	mu    sync.Mutex
	seq   uint64
	items map[uint64]*pending
	// roomsTo counts the items about a room (key.Room != 0) by the peer
	// each goes to: a drain asks after every transition, so counts (one per
	// peer), not a scan of 100k items under the lock the senders need, and
	// by peer so it can leave out peers declared lost (they ack nothing).
	roomsTo map[poll.PeerID]int
	rng     *rand.Rand
	// removed is closed (and replaced) whenever a frame leaves the outbox,
	// so Shutdown waits for the acks it needs instead of polling on a
	// clock a test may be driving.
	removed chan struct{}
}

func newOutbox(base, maxBackoff time.Duration, seed uint64) *outbox {
	return &outbox{base: base, max: maxBackoff, items: make(map[uint64]*pending), roomsTo: make(map[poll.PeerID]int), rng: rand.New(rand.NewPCG(seed, seed+1)), removed: make(chan struct{})}
}

// putLocked stores p under its seq.
func (o *outbox) putLocked(p *pending) {
	if _, had := o.items[p.seq]; !had && p.key.Room != 0 {
		o.roomsTo[p.dest.PeerID()]++
	}
	o.items[p.seq] = p
}

// deleteLocked removes the frame seq and wakes the waiters of waitUntil.
func (o *outbox) deleteLocked(seq uint64) {
	if p, ok := o.items[seq]; ok && p.key.Room != 0 {
		id := p.dest.PeerID()
		if o.roomsTo[id]--; o.roomsTo[id] == 0 {
			delete(o.roomsTo, id)
		}
	}
	delete(o.items, seq)
	o.wakeLocked()
}

// wakeLocked wakes the waiters of waitUntil and FrameAcked.
func (o *outbox) wakeLocked() {
	close(o.removed)
	o.removed = make(chan struct{})
}

// wake is wakeLocked for a change outside the outbox that waiters count
// by (a peer declared lost).
func (o *outbox) wake() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.wakeLocked()
}

// waitUntil returns true once done holds, re-checking it each time a frame
// leaves the outbox, or done's value when ctx ends first. done must not
// hold o.mu.
func (o *outbox) waitUntil(ctx context.Context, done func() bool) bool {
	for {
		o.mu.Lock()
		removed := o.removed
		o.mu.Unlock()
		if done() {
			return true
		}
		select {
		case <-ctx.Done():
			return done()
		case <-removed:
		}
	}
}

// nextSeq draws a fresh seq for a frame about to be encoded.
func (o *outbox) nextSeq() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.seq++
	return o.seq
}

// add registers p, whose seq and frame are set, with its first retransmit
// time. p must be complete before it is added: the retransmit worker reads
// it from then on.
func (o *outbox) add(now int64, p *pending) {
	o.mu.Lock()
	defer o.mu.Unlock()
	p.next = now + o.backoffLocked(0)
	o.putLocked(p)
}

// backoffLocked is base*2^attempt capped at max, scaled by a random factor
// in [0.5, 1) so peers do not retry in lockstep.
func (o *outbox) backoffLocked(attempt int) int64 {
	d := o.base << min(attempt, 20)
	if d <= 0 || d > o.max {
		d = o.max
	}
	return int64(d)/2 + o.rng.Int64N(int64(d)/2+1)
}

// take removes and returns the frame acknowledged by seq if it went to the
// peer that acknowledged it.
func (o *outbox) take(seq uint64, from poll.PeerID) *pending {
	o.mu.Lock()
	defer o.mu.Unlock()
	p := o.items[seq]
	if p == nil || p.dest.PeerID() != from {
		return nil
	}
	o.deleteLocked(seq)
	return p
}

// requeue puts back a frame whose ACK said "try again".
func (o *outbox) requeue(now int64, p *pending) {
	o.mu.Lock()
	defer o.mu.Unlock()
	p.attempt++
	p.next = now + o.backoffLocked(p.attempt)
	o.putLocked(p)
}

// due returns the frames to send again at now and removes the expired
// ones (returned separately).
func (o *outbox) due(now int64) (resend, expired []*pending) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for seq, p := range o.items {
		switch {
		case now >= p.giveUp:
			o.deleteLocked(seq)
			expired = append(expired, p)
		case now >= p.next:
			p.attempt++
			p.next = now + o.backoffLocked(p.attempt)
			resend = append(resend, p)
		}
	}
	return resend, expired
}

// awaitRegister marks the frames about key to go again once their peer
// acknowledged our REGISTER (the room moved to a restarted peer's new
// instance, which knows none of them yet).
func (o *outbox) awaitRegister(key poll.Key) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range o.items {
		if p.key == key {
			p.afterRegister = true
		}
	}
}

// registered returns the frames to the peer that were waiting for it to
// acknowledge our REGISTER, to be sent at once, and clears their mark.
func (o *outbox) registered(id poll.PeerID) []*pending {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []*pending
	for _, p := range o.items {
		if p.afterRegister && p.dest.PeerID() == id {
			p.afterRegister = false
			out = append(out, p)
		}
	}
	return out
}

// drop removes a frame (its room no longer wants it).
func (o *outbox) drop(seq uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.deleteLocked(seq)
}

// cancelPeer drops every frame to the peer (it restarted: the new instance
// knows none of them).
func (o *outbox) cancelPeer(id poll.PeerID) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for seq, p := range o.items {
		if p.dest.PeerID() == id {
			o.deleteLocked(seq)
			n++
		}
	}
	return n
}

// len returns the number of frames waiting for an ACK.
func (o *outbox) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.items)
}

// pendingOf returns the number of frames of type ft waiting for an ACK.
func (o *outbox) pendingOf(ft FrameType) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, p := range o.items {
		if p.ft == ft {
			n++
		}
	}
	return n
}

// roomFrames returns the number of frames about a room (not REGISTER)
// waiting for an ACK.
func (o *outbox) roomFrames() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, c := range o.roomsTo {
		n += c
	}
	return n
}

// roomFramesExcept returns the number of frames about a room whose peer is
// not skipped. skip runs without the outbox lock (it may take the link's).
func (o *outbox) roomFramesExcept(skip func(poll.PeerID) bool) int {
	o.mu.Lock()
	byPeer := maps.Clone(o.roomsTo)
	o.mu.Unlock()
	n := 0
	for id, c := range byPeer {
		if !skip(id) {
			n += c
		}
	}
	return n
}

// dedupe remembers the final answers given to one peer incarnation's
// frames, so a duplicate is answered again but not applied again. It is a
// bounded window: the oldest answers are forgotten first; a frame older
// than the window is processed again, which the handlers make harmless
// (they are idempotent).
//
// It also knows the frames handed to the room owner and not answered yet
// (withOwner): a retransmit of one is neither delivered again nor answered
// early; the owner's answer (Link.Ack) moves it into the window.
type dedupe struct {
	seen      map[uint64]AckResult
	order     []uint64
	head      int
	withOwner map[uint64]struct{}
}

func newDedupe(window int) *dedupe {
	return &dedupe{seen: make(map[uint64]AckResult), order: make([]uint64, 0, window), withOwner: make(map[uint64]struct{})}
}

// heldByOwner reports whether the frame seq is with the room owner.
func (d *dedupe) heldByOwner(seq uint64) bool {
	_, ok := d.withOwner[seq]
	return ok
}

func (d *dedupe) get(seq uint64) (AckResult, bool) {
	a, ok := d.seen[seq]
	return a, ok
}

func (d *dedupe) put(seq uint64, a AckResult) {
	if _, ok := d.seen[seq]; ok {
		d.seen[seq] = a
		return
	}
	if len(d.order) < cap(d.order) {
		d.order = append(d.order, seq)
	} else {
		delete(d.seen, d.order[d.head])
		d.order[d.head] = seq
		d.head = (d.head + 1) % len(d.order)
	}
	d.seen[seq] = a
}
