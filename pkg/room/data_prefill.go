package room

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/rankmap"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// PrefillData is the prefill owner's data plane over the
// --data-transport's transfer.Transport. Each room is one stream: its
// first Send opens it, every Send appends its pages at once, the last
// carries the aux row and closes it.
//
// The per-room state (rooms, fenced) is the owner's: it is touched only
// in owner inputs (Bind with the METADATA that binds the room, a Send's
// checks and append, Fence and Forget as effects), never under a lock of
// its own. A last Send's wait for admission is parked on the room
// (section 5 of docs/history/room-PLAN.md): the stream's admitted event (Stream.Admitted,
// posted to the owner) answers it, or, at the latest, the room's Failed
// becoming visible or the room going; no caller waits inside the data
// plane.
type PrefillData struct {
	log  *zap.Logger
	kind transfer.Kind
	scfg transfer.SenderConfig
	node *PrefillOwner
	// newTransport builds the transport once the region is registered
	// (transfer.NewTransport of kind; a fake in tests).
	newTransport func(transfer.RegionSet, transfer.SenderConfig) (transfer.Transport, error)

	slot regionSlot
	// senderMu guards sender, set once the region is registered (a gRPC
	// goroutine) and read by the owner and the Sends waiting for
	// admission.
	senderMu sync.Mutex
	sender   transfer.Transport

	rooms  map[roomRank][]*prefillRoom // the owner's: each rank's shares of a room, one per decode rank it feeds
	fenced map[poll.Key]bool           // the owner's; sticky until Forget (a late Bind is ignored)
	bytes  atomic.Uint64
	fences rankFences

	plans peerPlans
}

// roomRank names one prefill rank's part of a room.
type roomRank struct {
	id poll.RoomID
	tp uint16
}

// prefillRoom is one prefill rank's share of a room: the decode rank it
// feeds (equal TP: the same index; MLA with decode TP larger: one of
// several), its stream and positions.
type prefillRoom struct {
	key  poll.Key
	rank transfer.Rank // the prefill rank, its source region
	// dummy: the rank feeds no decode rank of the room (MLA with prefill TP
	// larger: decode reads the latent from a sibling): its Sends are taken
	// and move nothing (SGLang's is_dummy).
	dummy bool
	// dstRank is the decode rank fed: the stream's key carries it, as the
	// receiver's expectation does.
	dstRank transfer.Rank
	// copies are the head slices the stream carries (MHA between TP
	// sizes; nil: whole pages), and noAux says another prefill rank sends
	// the decode rank's aux row.
	copies   []rankmap.Copy
	noAux    bool
	peerAddr string
	dst      []transfer.Run // decode's pages, in position order
	dstPages int64          // positions, the prefix included
	prefix   int64          // leading positions decode holds: a Send's pages there move no bytes
	src      []transfer.Run // pages handed over so far, in the order taken
	// next is every buffer's next position while every Send named all
	// buffers; nextOf holds one per buffer from the first Send that named
	// a subset on (layer-wise), and next is unused from then.
	next     int64
	nextOf   *[]int64    // a pointer: 8 bytes in every bound room, not a slice's 24
	chunks   []sentChunk // the Sends taken, so a retry is recognised
	opened   bool        // the room's stream is open on the data plane
	started  bool        // the last Send was taken: the stream is closed
	admitted bool        // the stream's last piece is admitted: a last Send answers OK
}

// sentChunk is one Send a room took: its pages are src[at:at+runs].
type sentChunk struct {
	start    int64
	at, runs int
	buffers  []int // nil for all
	last     bool
	auxIndex uint32
}

// repeats reports whether a Send is one the room already took: a client
// that timed out and retries gets the answer of the first call.
func (r *prefillRoom) repeats(start int64, src []transfer.Run, buffers []int, last bool, auxIndex uint32) bool {
	for _, c := range r.chunks {
		if c.start == start && c.last == last && (!last || c.auxIndex == auxIndex) && slices.Equal(c.buffers, buffers) &&
			slices.Equal(r.src[c.at:c.at+c.runs], src) {
			return true
		}
	}
	return false
}

// nextPosition is buffer b's next position.
func (r *prefillRoom) nextPosition(b int) int64 {
	if r.nextOf == nil {
		return r.next
	}
	return (*r.nextOf)[b]
}

// named calls f for each buffer a Send names (buffers nil: all of nbuf)
// until f returns false.
func named(buffers []int, nbuf int, f func(b int) bool) {
	if buffers == nil {
		for b := range nbuf {
			if !f(b) {
				return
			}
		}
		return
	}
	for _, b := range buffers {
		if !f(b) {
			return
		}
	}
}

// moved is the part of a Send's pages from start that moves: those below
// decode's prefix are accepted and skipped.
func (r *prefillRoom) moved(start int64, src []transfer.Run) []transfer.Run {
	return runsFrom(src, r.prefix-start)
}

// advance records that the named buffers have every position up to end.
func (r *prefillRoom) advance(buffers []int, nbuf int, end int64) {
	if buffers == nil && r.nextOf == nil {
		r.next = end
		return
	}
	if r.nextOf == nil {
		next := make([]int64, nbuf)
		for b := range next {
			next[b] = r.next
		}
		r.nextOf = &next
	}
	named(buffers, nbuf, func(b int) bool { (*r.nextOf)[b] = end; return true })
}

// checkPositions applies the position rules to a Send of n pages from
// start in the named buffers: start is each one's next position, or, while
// that is inside decode's prefix, any later position up to prefix_len (a
// scheduler that knows the prefix skips it, as SGLang's prefill does);
// the pages fit the destination; a last Send leaves every buffer at the
// end.
func (r *prefillRoom) checkPositions(start, n int64, buffers []int, nbuf int, last bool) error {
	var err error
	named(buffers, nbuf, func(b int) bool {
		next := r.nextPosition(b)
		switch {
		case start != next && !(next < start && start <= r.prefix):
			var which, skip string
			if r.nextOf != nil {
				which = fmt.Sprintf(" of buffer %d", b)
			}
			if next < r.prefix {
				skip = fmt.Sprintf(" (or any up to %d, decode's prefix_len)", r.prefix)
			}
			err = invalid("start_position", "is %d, next page position%s is %d%s", start, which, next, skip)
		case start+n > r.dstPages:
			err = invalid("pages", "%d pages after position %d overflow the %d destination pages", n, start, r.dstPages)
		}
		return err == nil
	})
	if err != nil || !last {
		return err
	}
	for b := range nbuf {
		end := r.nextPosition(b)
		if buffers == nil || slices.Contains(buffers, b) {
			end = start + n
		}
		if end != r.dstPages {
			if buffers == nil && r.nextOf == nil {
				return invalid("last", "last chunk ends at page %d of %d destination pages", end, r.dstPages)
			}
			return invalid("last", "buffer %d ends at position %d of %d destination pages: every buffer must have every position", b, end, r.dstPages)
		}
	}
	return nil
}

var _ PrefillDataPlane = (*PrefillData)(nil)

// newPrefillData returns the owner's data plane of the given kind, built
// when the region is registered, reporting to node.
func newPrefillData(kind transfer.Kind, cfg transfer.SenderConfig, log *zap.Logger, node *PrefillOwner) *PrefillData {
	d := &PrefillData{log: log, kind: kind, scfg: cfg, node: node, rooms: map[roomRank][]*prefillRoom{}, fenced: map[poll.Key]bool{}}
	d.newTransport = func(r transfer.RegionSet, cfg transfer.SenderConfig) (transfer.Transport, error) {
		return transfer.NewTransport(d.kind, r, cfg)
	}
	d.scfg.OnFenced = func(k transfer.Key) { d.fences.onFenced(k, func() { d.node.Fenced(pkey(k)) }) }
	d.slot.log = log
	d.slot.onSet = func(r transfer.RegionSet, first *transfer.Region) error {
		s, err := d.newTransport(r, d.scfg)
		if err != nil {
			return err
		}
		d.senderMu.Lock()
		d.sender = s
		d.senderMu.Unlock()
		d.log.Info("data plane ready", zap.String("transport", string(d.kind)), zap.String("region", first.Path()))
		return nil
	}
	return d
}

// Bytes is the KV bytes this side sent and decode confirmed.
func (d *PrefillData) Bytes() uint64 { return d.bytes.Load() }

// boundKeys are the rooms bound to decode for rank on this side's data
// plane: the ones a replacement of rank's region fails. On the owner.
func (d *PrefillData) boundKeys(rank transfer.Rank) []poll.Key {
	keys := make([]poll.Key, 0, len(d.rooms))
	for rr, shares := range d.rooms {
		if r := shares[0]; rr.tp == rank.TP && r.rank == rank && !r.dummy {
			keys = append(keys, r.key)
		}
	}
	return keys
}

func (d *PrefillData) transport() transfer.Transport {
	d.senderMu.Lock()
	defer d.senderMu.Unlock()
	return d.sender
}

// Close stops the sender (unfinished transfers fail) and unmaps the region.
func (d *PrefillData) Close() {
	if s := d.transport(); s != nil {
		s.Close()
	}
	d.slot.close()
}

// Bind implements PrefillDataPlane, on the owner in the input that
// applied the METADATA: a Send that sees the room WaitingForInput finds it
// bound. Decode rank md.Rank's METADATA binds the prefill ranks that feed
// it, from the peer's rank mapping (transfer.PlanRanks, peerplan.go): with
// equal TP, prefill rank i feeds decode rank i. A mapping that needs
// dummies or head slices (MLA or MHA with different TP) is refused: the
// room fails invalid rather than move bytes the wrong way.
func (d *PrefillData) Bind(peer conn.PeerInfo, md Metadata) {
	local, sender := d.slot.get(), d.transport()
	if d.fenced[md.Key] || local == nil || sender == nil {
		if local == nil {
			d.log.Warn("metadata before any region is registered", conn.RoomField(md.Key), zap.Stringer("rank", rankName(md.Rank)))
		}
		return
	}
	dstRank := transfer.Rank(md.Rank)
	var layout *pdlinkv1.RegionLayout
	for _, l := range peer.Layouts {
		if transferRank(l.GetRank()) == dstRank {
			layout = l
		}
	}
	pl, err := layoutFromProto("layout", layout)
	if err == nil {
		err = d.plans.plan(d.log, peer.Addr, local.Layout(), pl)
	}
	var sources, dummies []transfer.Rank
	if err == nil {
		sources, dummies, err = d.sourcesOf(peer.Addr, dstRank)
	}
	if err == nil {
		err = sender.AddPeer(peer.Addr, pl)
	}
	if err != nil {
		d.log.Warn("cannot bind room to decode peer", conn.RoomField(md.Key), zap.Stringer("rank", rankName(md.Rank)), zap.String("peer", peer.Addr), zap.Error(err))
		// Its own input, later: this one is stepping the METADATA.
		go d.node.OnFailed(md.Key, poll.ReasonInvalid)
		return
	}
	// The frame check (pkg/conn) vetted the list; whether its pages are inside
	// decode's buffers is decode's to check, on its edge and on every chunk.
	dst := runsOf(md.DstPages)
	prefix := min(int64(md.PrefixLen), transfer.CountPages(dst)) // the frame check bounds it; min keeps the slicing safe
	for _, src := range sources {
		rr := roomRank{md.Key.Room, src.TP}
		shares := d.rooms[rr]
		if len(shares) > 0 && (shares[0].key != md.Key || shares[0].dummy) {
			shares = nil // left by another request of the id (its Forget is on the way)
		}
		if slices.ContainsFunc(shares, func(r *prefillRoom) bool { return r.dstRank == dstRank }) {
			continue // a retransmitted METADATA
		}
		share := &prefillRoom{key: md.Key, rank: src, dstRank: dstRank, peerAddr: peer.Addr, dst: dst,
			dstPages: transfer.CountPages(dst), prefix: prefix}
		if m, ok := d.plans.mapping(peer.Addr); ok && !wholePages(m, int(dstRank.TP)) {
			// Head slices: the stream carries the pair's copies and names its
			// prefill rank (a decode rank may take several), and only the
			// decode rank's AuxFrom sends the aux row.
			share.copies = m.CopiesFrom(int(src.TP), int(dstRank.TP))
			share.noAux = m.DecodeRanks[dstRank.TP].AuxFrom != int(src.TP)
		}
		d.rooms[rr] = append(shares, share)
	}
	for _, src := range dummies {
		if rr := (roomRank{md.Key.Room, src.TP}); len(d.rooms[rr]) == 0 || d.rooms[rr][0].key != md.Key {
			d.rooms[rr] = []*prefillRoom{{key: md.Key, rank: src, dummy: true}}
		}
	}
}

// wholePages reports whether decode rank dst of m takes whole pages (equal
// TP, MLA, a replicated head that is its whole row): one stream, keyed by
// the decode rank alone. Decode asks the same of its own plan
// (slicedSources).
func wholePages(m rankmap.Mapping, dst int) bool {
	if dst < 0 || dst >= len(m.DecodeRanks) {
		return true
	}
	return m.DecodeRanks[dst].WholePages()
}

// sourcesOf is the local ranks that feed decode rank dst of the peer at
// addr, from its mapping, and the dummies: ranks dst addresses that feed
// no decode rank at all (their Sends move nothing). An error for a source
// rank with no region.
func (d *PrefillData) sourcesOf(addr string, dst transfer.Rank) (sources, dummies []transfer.Rank, err error) {
	m, ok := d.plans.mapping(addr)
	if !ok {
		return nil, nil, fmt.Errorf("%w: no rank mapping for %s", ErrRankMapping, addr)
	}
	if int(dst.TP) >= len(m.DecodeRanks) || int(dst.Size) != len(m.DecodeRanks) {
		return nil, nil, fmt.Errorf("%w: decode rank %d of %d outside the mapping's %d ranks", ErrRankMapping, dst.TP, dst.Size, len(m.DecodeRanks))
	}
	size := uint16(len(m.PrefillRanks))
	dr := m.DecodeRanks[dst.TP]
	for _, from := range dr.From {
		src := transfer.Rank{TP: uint16(from), Size: size}
		if d.slot.rank(src) == nil {
			return nil, nil, fmt.Errorf("%w: prefill rank %d of %d feeds decode rank %d and has no region", ErrRankMapping, from, size, dst.TP)
		}
		sources = append(sources, src)
	}
	for _, s := range dr.Dummies {
		if len(m.PrefillRanks[s].To) == 0 {
			dummies = append(dummies, transfer.Rank{TP: uint16(s), Size: size})
		}
	}
	return sources, dummies, nil
}

// Fence implements PrefillDataPlane without waiting, on the owner: the
// sender stops every rank's stream of the room at once and answers done
// when no worker reads its source pages; otherwise its OnFenced tells the
// node Fenced once the last worker let go (within FenceGrace plus one
// chunk write).
func (d *PrefillData) Fence(key poll.Key) bool {
	d.fenced[key] = true
	s := d.transport()
	if s == nil {
		return true
	}
	return d.fences.fence(d.streamKeys(key), s.Fence, func() { d.node.Fenced(key) })
}

// streamKeys are the data-plane keys a fence of the room covers: every
// local rank's, and those of the streams its shares opened (keyed by the
// decode rank they feed, and the prefill rank for head slices). On the
// owner.
func (d *PrefillData) streamKeys(key poll.Key) []transfer.Key {
	keys := d.slot.keys(key)
	for tp := range d.slot.size() {
		for _, r := range d.rooms[roomRank{key.Room, tp}] {
			if r.key == key && !r.dummy {
				if k := r.streamKey(); !slices.Contains(keys, k) {
					keys = append(keys, k)
				}
			}
		}
	}
	return keys
}

// streamKey is the share's stream key: the decode rank's, and for head
// slices the prefill rank's too.
func (r *prefillRoom) streamKey() transfer.Key {
	k := tkey(r.key, r.dstRank)
	if r.copies != nil {
		k.From = r.rank
	}
	return k
}

// Forget implements PrefillDataPlane, on the owner.
func (d *PrefillData) Forget(key poll.Key) {
	d.Fence(key) // a room reaped unfenced: stop its transfer all the same
	delete(d.fenced, key)
	for tp := range d.slot.size() {
		rr := roomRank{key.Room, tp}
		if shares := d.rooms[rr]; len(shares) > 0 && (shares[0].key == key || key.Nonce == 0) {
			delete(d.rooms, rr)
		}
	}
}

// send checks one chunk of source pages against the region (on the
// caller), then against its room and appends it (one owner input); the
// last one closes the stream and waits, parked on the room, for its
// admission.
func (d *PrefillData) send(ctx context.Context, req *pdlinkv1.SendRequest) error {
	if err := d.slot.checkRank("rank", req.Rank); err != nil {
		return err
	}
	rank := transferRank(req.Rank)
	region := d.slot.rank(rank)
	if region == nil {
		return ErrNoRegion // unregistered since the check
	}
	if m := region.Current(); m != nil {
		if reason, stale := d.slot.stale(rank, m); stale {
			// The engine recreated (or truncated) its file and has not
			// registered it: these pages would be read from the dead inode.
			return d.failStale(ctx, poll.RoomID(req.RoomId), rank, reason)
		}
	}
	buffers, err := bufferSet("buffers", req.Buffers, len(region.Layout().Buffers))
	if err != nil {
		return err
	}
	var src []transfer.Run
	if !req.Last || len(req.Pages.GetIndices()) > 0 || len(req.Pages.GetRuns()) > 0 {
		// Only the last Send may have no pages: it may carry just the aux
		// row (decode held every position, or every buffer is complete).
		if src, err = pageRuns("pages", req.Pages, region.Layout().Buffers[0].Pages()); err != nil {
			return err
		}
	}
	var out sendOutcome
	if !d.node.execOwned(func() { out = d.take(ctx, sendOf{req, src, buffers, rank}, region) }) {
		return conn.ErrClosedNode
	}
	switch {
	case out.err != nil:
		return out.err
	case out.ended:
		return d.answerEnded(ctx, out.key)
	case out.parked == nil:
		return nil
	}
	return d.awaitAdmission(ctx, out)
}

// failStale fails a room whose region file changed under it with reason
// (the peer is told) and answers with its state.
func (d *PrefillData) failStale(ctx context.Context, id poll.RoomID, rank transfer.Rank, reason poll.Reason) error {
	_ = d.node.abortThen(ctx, id, reason, d.slot.countedFailure(rank, reason))
	return d.notSendableNow(id)
}

// replacedAtPeer fails a room whose pages decode found gone from rank's
// file (the same-host path's per-chunk stat saw it replaced or removed)
// with region_replaced, counted as a bind or Send that sees the file
// replaced is: the file once per generation (one stat here, which also
// logs it), the room among those its generation's retire reports. Posted,
// as OnFailed is: the transfer goroutine never waits for the owner.
func (d *PrefillData) replacedAtPeer(key poll.Key, rank transfer.Rank) {
	if region := d.slot.rank(rank); region != nil {
		if m := region.Current(); m != nil {
			d.slot.stale(rank, m)
		}
	}
	counted := d.slot.countedFailure(rank, poll.ReasonRegionReplaced)
	n := d.node
	n.post(func() {
		n.applyOwned(func() {
			in, err := n.t.Get(key.Room)
			if err != nil || in.Key != key || in.State.Terminal() {
				return // failed already (the register's retire, an abort): counted there
			}
			if n.t.Step(n.now(), poll.Event{Kind: poll.EvAbortLocal, Key: key, Reason: poll.ReasonRegionReplaced}) == nil {
				counted()
			}
		})
	})
}

// sendOf is a Send checked at the edge: its source pages as runs and the
// buffers it names (nil: all).
type sendOf struct {
	*pdlinkv1.SendRequest
	src     []transfer.Run
	buffers []int
	rank    transfer.Rank
}

// sendOutcome is what a Send's owner input decided.
type sendOutcome struct {
	err error
	// ended: the data plane refused the pages because the room ended;
	// answer with its state once that is visible.
	ended bool
	key   poll.Key
	// parked, when set, is the last Send's wait for admission, parked on
	// the room.
	parked *parkedCall
}

// take checks a Send against its room and appends its pages, as one
// owner input: the room moves to Transferring (a later Send's refreshes
// its idle deadline) before its pages may go, as a transfer completing
// first would leave decode's Success no state to land on.
func (d *PrefillData) take(ctx context.Context, req sendOf, region *transfer.Region) sendOutcome {
	n := d.node
	rr := roomRank{poll.RoomID(req.RoomId), req.rank.TP}
	shares := d.rooms[rr]
	if len(shares) == 0 || shares[0].rank != req.rank {
		return sendOutcome{err: d.notSendable(poll.RoomID(req.RoomId), nil)}
	}
	if d.fenced[shares[0].key] {
		// Failed: say so before judging the chunk against a room that
		// will take no more.
		return sendOutcome{err: d.notSendable(rr.id, poll.ErrTerminal)}
	}
	if shares[0].dummy {
		// Decode reads nothing from this rank: its pages stay here, and its
		// Sends count as the scheduler's progress, also once its siblings'
		// bytes made the room Success.
		if err := n.firstSendOwned(rr.id); err != nil && !d.succeeded(rr.id) {
			return sendOutcome{err: d.notSendable(rr.id, err)}
		}
		return sendOutcome{}
	}
	// One stream per decode rank this rank feeds (MLA with decode TP
	// larger: several, each the whole latent), the pages appended to each.
	wait := false
	for _, r := range shares {
		out, last := d.takeShare(ctx, req, region, rr, r)
		if out.err != nil || out.ended {
			return out
		}
		wait = wait || last
	}
	if !wait {
		return sendOutcome{}
	}
	return d.park(ctx, rr)
}

// succeeded reports whether the room is Success, on the owner.
func (d *PrefillData) succeeded(id poll.RoomID) bool {
	var in poll.RoomInfo
	var err error
	c := d.node.core
	c.withTable(func() { in, err = c.t.Get(id) })
	return err == nil && in.State == poll.Success
}

// takeShare is take for one of the rank's shares; last reports a last
// Send that waits for the rank's admission.
func (d *PrefillData) takeShare(ctx context.Context, req sendOf, region *transfer.Region, rr roomRank, r *prefillRoom) (out sendOutcome, last bool) {
	n := d.node
	sender := d.transport()
	nbuf := len(region.Layout().Buffers)
	start, src := int64(req.StartPosition), req.src
	key, tk := r.key, r.streamKey()
	behind := false // start is a position some named buffer already has
	named(req.buffers, nbuf, func(b int) bool { behind = start < r.nextPosition(b); return !behind })
	if (r.started || behind) && r.repeats(start, src, req.buffers, req.Last, req.AuxIndex) {
		// A retried last Send answers as the first call does: once the
		// room's pages are admitted, or with the failure that ended them.
		return sendOutcome{}, req.Last
	}
	if r.started {
		return sendOutcome{err: errorf(ErrNotSendable, "room already sent its last chunk")}, false
	}
	pages := transfer.CountPages(src)
	if err := r.checkPositions(start, pages, req.buffers, nbuf, req.Last); err != nil {
		return sendOutcome{err: err}, false
	}
	var aux []byte
	if req.Last && region.Layout().Aux.Rows > 0 {
		if int64(req.AuxIndex) >= region.Layout().Aux.Rows {
			return sendOutcome{err: invalid("aux_index", "row %d of %d", req.AuxIndex, region.Layout().Aux.Rows)}, false
		}
		aux = region.AuxRow(int64(req.AuxIndex))
	}
	if err := n.firstSendOwned(key.Room); err != nil {
		return sendOutcome{err: d.notSendable(key.Room, err)}, false
	}
	if d.fenced[key] || !slices.Contains(d.rooms[rr], r) {
		// The step's effects fenced or forgot the room.
		return sendOutcome{err: d.notSendable(key.Room, poll.ErrTerminal)}, false
	}
	if !r.opened {
		// The stream opens with the room's first Send: its pages go on the
		// wire at once, each later Send's continue it, the last closes it.
		// Its destination starts after decode's prefix: the k-th page sent
		// of a buffer goes to its (prefix+k)-th destination position.
		bytes := streamBytes(region.Layout(), r.copies, r.dstPages-r.prefix)
		rank, dst, srcRank := r.rank.TP, r.dstRank.TP, r.rank
		err := sender.Open(transfer.Stream{Peer: r.peerAddr, Key: tk, Source: r.rank, Copies: r.copies, Dst: transfer.SamePages(nbuf, runsFrom(r.dst, r.prefix)),
			Done: func(err error) { d.done(key, srcRank, bytes, err) },
			// Each chunk written refreshes the room's transfer-idle deadline: a last Send
			// whose pages wait behind other rooms' or move over a slow link is not idle.
			Progress: func(int64) { d.node.OnProgress(key) },
			// The last piece's admission answers the last Send: posted, as the data
			// plane's other events are (it may come from inside the Append below).
			Admitted: func() { d.node.post(func() { d.admitted(key, rank, dst) }) }})
		if err != nil {
			return d.refused(key, err), false
		}
		r.opened = true
	}
	moved := r.moved(start, src)
	piece := transfer.Piece{Src: make([][]transfer.Run, nbuf), Last: req.Last, Aux: aux}
	if r.noAux {
		piece.Aux = nil
	}
	named(req.buffers, nbuf, func(b int) bool { piece.Src[b] = moved; return true })
	// Appended on the owner, so concurrent Sends of a room reach the
	// stream in the order their start positions were checked.
	if err := sender.Append(tk, piece); err != nil {
		return d.refused(key, err), false
	}
	r.chunks = append(r.chunks, sentChunk{start: start, at: len(r.src), runs: len(src), buffers: req.buffers, last: req.Last, auxIndex: req.AuxIndex})
	r.src = append(r.src, src...)
	r.advance(req.buffers, nbuf, start+pages)
	r.started = req.Last
	return sendOutcome{}, req.Last
}

// park parks a last Send's wait for admission on its room, unless every
// stream of the rank has its last piece admitted already (then it answers
// OK): the rank's admitted events wake it (admitted), and so do the
// room's Failed becoming visible and the room going, whatever the data
// plane does.
func (d *PrefillData) park(ctx context.Context, rr roomRank) sendOutcome {
	shares := d.rooms[rr]
	if allAdmitted(shares) {
		return sendOutcome{}
	}
	key := shares[0].key
	p := &parkedCall{woken: make(chan struct{}), admission: ctx, rank: rr.tp}
	c := d.node.core
	c.withTable(func() { c.parked[key] = append(c.parked[key], p) })
	return sendOutcome{key: key, parked: p}
}

// allAdmitted reports whether every share's last piece is admitted.
func allAdmitted(shares []*prefillRoom) bool {
	for _, r := range shares {
		if !r.admitted {
			return false
		}
	}
	return true
}

// admitted is the room's admitted event, on the owner: the stream's last
// piece is in the peer's in-flight budget. The last Sends parked on the
// room answer OK, and a retry from now on at once.
func (d *PrefillData) admitted(key poll.Key, rank, dst uint16) {
	shares := d.rooms[roomRank{key.Room, rank}]
	i := slices.IndexFunc(shares, func(r *prefillRoom) bool { return r.key == key && r.dstRank.TP == dst })
	if i < 0 {
		return // the room went meanwhile: its Sends were answered then
	}
	shares[i].admitted = true
	if !allAdmitted(shares) {
		return // the rank's other streams are still queued
	}
	c := d.node.core
	c.withTable(func() {
		kept := c.parked[key][:0]
		for _, p := range c.parked[key] {
			if p.admission == nil || p.rank != rank {
				kept = append(kept, p)
				continue
			}
			p.done, p.admitted = true, true
			close(p.woken)
		}
		if len(kept) == 0 {
			delete(c.parked, key)
		} else {
			c.parked[key] = kept
		}
	})
}

// awaitAdmission waits, parked on the room, for the room's pages to be
// admitted into the peer's in-flight budget: the last Send's backpressure.
// The owner answers it from the admitted event, or when the room's Failed
// is visible or the room went (the Send answers with that state). A ctx
// that ends first answers its error and leaves the room going: its pages
// stay queued, go when admitted, and Poll shows the outcome; a retry of the
// same Send waits for the same admission.
func (d *PrefillData) awaitAdmission(ctx context.Context, out sendOutcome) error {
	p, c := out.parked, d.node.core
	select {
	case <-p.woken:
	case <-ctx.Done():
		c.unpark(out.key, p) // on the owner: p.admitted is settled once it returns
	case <-c.halted:
		c.unpark(out.key, p)
		if !p.admitted {
			return conn.ErrClosedNode
		}
	}
	switch {
	case p.admitted:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	}
	return d.notSendableNow(out.key.Room)
}

// answerEnded answers a Send whose room ended (fenced, or its stream
// failed and Done said why) with the room's state, as any Send to an
// ended room is, once the scheduler can see it (the fence or failure may
// not have been stepped yet).
func (d *PrefillData) answerEnded(ctx context.Context, key poll.Key) error {
	_ = d.node.AwaitFailedVisible(ctx, key.Room)
	return d.notSendableNow(key.Room)
}

// notSendableNow is notSendable as its own owner input.
func (d *PrefillData) notSendableNow(id poll.RoomID) error {
	var err error
	d.node.exec(func() { err = d.notSendable(id, poll.ErrTerminal) })
	return err
}

// refused answers, on the owner, a Send whose pages the data plane did
// not take, and fails the room if the data plane gave a failure reason.
func (d *PrefillData) refused(key poll.Key, err error) sendOutcome {
	if errors.Is(err, transfer.ErrFenced) || errors.Is(err, transfer.ErrStreamEnded) {
		return sendOutcome{ended: true, key: key}
	}
	d.log.Warn("transfer refused", conn.RoomField(key), zap.Error(err))
	if reason, fails := roomFailure(d.log, poll.Prefill, transfer.ReasonOf(err)); fails {
		d.node.applyOwned(func() {
			_ = d.node.t.Step(d.node.now(), poll.Event{Kind: poll.EvAbortLocal, Key: key, Reason: reason})
		})
	}
	if slice := headSliceError(err); slice != nil {
		return sendOutcome{err: slice}
	}
	return sendOutcome{err: errorf(ErrTransferRefused, "transfer refused: %v", err)}
}

// notSendable says, on the owner, why a room takes no Send, from its
// state now: poll.ErrNotFound when it is not open here, an EndedError for
// a Failed room, ErrNotSendable naming the state otherwise. err is the
// table's refusal, if any.
func (d *PrefillData) notSendable(id poll.RoomID, err error) error {
	var in poll.RoomInfo
	var gerr error
	c := d.node.core
	c.withTable(func() { in, gerr = c.t.Get(id) })
	switch {
	case gerr != nil:
		return errorf(poll.ErrNotFound, "room %d is not open here (never opened, or cleared): OpenSender first", id)
	case in.State == poll.Failed:
		return &EndedError{Info: in}
	case in.Visible == poll.Bootstrapping:
		return errorf(ErrNotSendable, "room %d is Bootstrapping: no metadata from decode yet, poll until WaitingForInput", id)
	case err != nil:
		return err
	}
	return errorf(ErrNotSendable, "room %d is %v and not bound to decode: poll until it fails or moves on", id, in.Visible)
}

func (d *PrefillData) done(key poll.Key, rank transfer.Rank, bytes int64, err error) {
	if err != nil {
		reason, fails := roomFailure(d.log, poll.Prefill, transfer.ReasonOf(err))
		switch {
		case !fails:
			// Decode ended the room before its bytes were in (fenced); its
			// control plane tells us why (ABORT, retried until acked), and
			// the transfer-idle deadline covers a notice that never comes.
			d.log.Debug("decode fenced the room", conn.RoomField(key), zap.Stringer("from_rank", rankName(rank)))
		case reason == poll.ReasonRegionReplaced:
			d.replacedAtPeer(key, rank)
		default:
			d.node.OnFailed(key, reason)
		}
		return
	}
	d.bytes.Add(uint64(bytes))
	d.node.OnProgress(key)
}

// Send is the scheduler's Send: one chunk of source pages, checked
// against the region and the room, appended to the room's stream at once;
// the last one closes the stream and returns once its pages are admitted
// into the peer's in-flight budget (or the room ended). The rank was
// checked at the edge.
func (n *PrefillOwner) Send(ctx context.Context, req *pdlinkv1.SendRequest) error {
	return n.data.send(ctx, req)
}

// Bytes is the KV bytes this side sent and decode confirmed.
func (n *PrefillOwner) Bytes() uint64 { return n.data.Bytes() }

// PeerPlans is every decode peer's rank mapping (or refusal) as last planned, by address.
func (n *PrefillOwner) PeerPlans() []PeerPlan {
	if n.data == nil {
		return nil
	}
	return n.data.plans.list()
}

// PeerMapping is the rank mapping kept for the decode peer at data address addr (false
// when it has none: not bound yet, or refused).
func (n *PrefillOwner) PeerMapping(addr string) (rankmap.Mapping, bool) {
	if n.data == nil {
		return rankmap.Mapping{}, false
	}
	return n.data.plans.mapping(addr)
}

// PeerLayoutsRefused is how many decode peer layouts could not map, by
// transfer.RefusalReason (pdlink_peer_layout_refused_total).
func (n *PrefillOwner) PeerLayoutsRefused(reason string) uint64 {
	if n.data == nil {
		return 0
	}
	return n.data.plans.refusals(reason)
}

// streamBytes is what a stream lands over pages destination positions: each buffer's
// whole page, or, for head slices, each copy's heads of every token of the page (a
// prefill rank's share of a decode page, not the source page it reads them from).
func streamBytes(l transfer.Layout, copies []rankmap.Copy, pages int64) int64 {
	var per int64
	if copies == nil {
		for _, b := range l.Buffers {
			per += b.ItemLen
		}
	}
	for _, c := range copies {
		per += int64(c.PageTokens * c.Heads * c.HeadBytes)
	}
	return pages * per
}
