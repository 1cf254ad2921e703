package room

import (
	"context"
	"errors"
	"fmt"
	"net"
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

// decodeNode is what DecodeData reports to: the DecodeOwner (a bare
// table in tests).
type decodeNode interface {
	OnProgress(key poll.Key)
	OnRankDone(key poll.Key, rank int)
	OnFailed(key poll.Key, reason poll.Reason)
	Fenced(key poll.Key)
}

// DecodeData is the decode owner's data plane over the --data-transport's
// transfer.Sink. The data listener is bound at start; connections that
// arrive before a region is registered are closed (a sender redials).
type DecodeData struct {
	log  *zap.Logger
	kind transfer.Kind
	rcfg transfer.ReceiverConfig
	node decodeNode
	// newSink builds the sink once the region is registered
	// (transfer.NewSink of kind; a fake in tests).
	newSink func(transfer.RegionSet, transfer.ReceiverConfig, transfer.Events) (transfer.Sink, error)

	slot regionSlot
	// mu guards receiver, set once the region is registered.
	mu       sync.Mutex
	receiver transfer.Sink
	bytes    atomic.Uint64
	refused  atomic.Uint64

	// metadata holds each rank's SendMetadata of a room until the room is
	// forgotten, so a retry is answered as the same request and another
	// one refused. It is the owner's: touched only in owner inputs, under
	// no lock.
	metadata map[metaKey]*sentMetadata
	fences   rankFences
	sliced   slicedRanks
}

// metaKey names one decode rank's share of a room.
type metaKey struct {
	key poll.Key
	tp  uint16
}

// sentMetadata is what a room's first SendMetadata asked for.
type sentMetadata struct {
	rank      transfer.Rank
	dst       []transfer.Run
	auxIndex  uint32
	prefixLen uint32
	done      chan struct{} // closed once the first call returned
	err       error         // the first call's error; read after done
}

// conflict names what differs from the metadata already sent ("" if
// nothing: the same request).
func (m *sentMetadata) conflict(o *sentMetadata) string {
	switch {
	case m.rank != o.rank:
		return "rank"
	case !slices.Equal(m.dst, o.dst):
		return "dst_pages"
	case m.auxIndex != o.auxIndex:
		return "aux_index"
	case m.prefixLen != o.prefixLen:
		return "prefix_len"
	}
	return ""
}

// claimMetadata records md as key's metadata unless some is recorded
// already: then it returns that one and false.
func (d *DecodeData) claimMetadata(key poll.Key, md *sentMetadata) (*sentMetadata, bool) {
	mk := metaKey{key, md.rank.TP}
	if prev := d.metadata[mk]; prev != nil {
		return prev, false
	}
	d.metadata[mk] = md
	return md, true
}

// settleMetadata ends the first call for key: a failed one is forgotten so
// the scheduler may try again.
func (d *DecodeData) settleMetadata(key poll.Key, md *sentMetadata, err error) {
	if mk := (metaKey{key, md.rank.TP}); err != nil && d.metadata[mk] == md {
		delete(d.metadata, mk)
	}
	md.err = err
	close(md.done)
}

var _ DecodeDataPlane = (*DecodeData)(nil)

// newDecodeData returns the owner's data plane of the given kind, built
// when the region is registered, reporting to node.
func newDecodeData(kind transfer.Kind, cfg transfer.ReceiverConfig, log *zap.Logger, node decodeNode) *DecodeData {
	d := &DecodeData{log: log, kind: kind, rcfg: cfg, node: node, metadata: map[metaKey]*sentMetadata{},
		sliced: slicedRanks{keys: map[poll.Key][]transfer.Key{}, remaining: map[metaKey]int{}, prefillRanks: map[metaKey]int{}}}
	d.rcfg.OnFenced = func(k transfer.Key) { d.fences.onFenced(k, func() { d.node.Fenced(pkey(k)) }) }
	d.slot.log = log
	d.newSink = func(r transfer.RegionSet, cfg transfer.ReceiverConfig, ev transfer.Events) (transfer.Sink, error) {
		return transfer.NewSink(d.kind, r, cfg, ev)
	}
	d.slot.onSet = func(r transfer.RegionSet, first *transfer.Region) error {
		rx, err := d.newSink(r, d.rcfg, decodeEvents{d})
		if err != nil {
			return err
		}
		d.mu.Lock()
		d.receiver = rx
		d.mu.Unlock()
		d.log.Info("data plane ready", zap.String("transport", string(d.kind)), zap.String("region", first.Path()))
		return nil
	}
	return d
}

// expectedKeys are the rooms with metadata for rank on this side's data
// plane: the ones a replacement of rank's region fails. On the owner.
func (d *DecodeData) expectedKeys(rank transfer.Rank) []poll.Key {
	keys := make([]poll.Key, 0, len(d.metadata))
	for k, md := range d.metadata {
		if md.rank == rank {
			keys = append(keys, k.key)
		}
	}
	return keys
}

// Layouts returns the registered region layouts (for REGISTER).
func (d *DecodeData) Layouts() []*pdlinkv1.RegionLayout { return d.slot.layouts() }

// Bytes is the KV bytes written and verified.
func (d *DecodeData) Bytes() uint64 { return d.bytes.Load() }

// DataRefused is how many data frames the receiver refused for reason
// (pdlink_data_refused_total); 0 before the first region.
func (d *DecodeData) DataRefused(reason transfer.Refusal) uint64 {
	d.mu.Lock()
	rx := d.receiver
	d.mu.Unlock()
	if r, ok := rx.(interface{ Refused(transfer.Refusal) uint64 }); ok {
		return r.Refused(reason)
	}
	return 0
}

// Serve hands every accepted data connection to the receiver until ln
// closes.
func (d *DecodeData) Serve(ln net.Listener) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		d.mu.Lock()
		rx := d.receiver
		d.mu.Unlock()
		if rx == nil {
			d.refused.Add(1)
			c.Close()
			continue
		}
		rx.ServeConn(c)
	}
}

// Close stops the receiver and unmaps the region.
func (d *DecodeData) Close() {
	d.mu.Lock()
	rx := d.receiver
	d.mu.Unlock()
	if rx != nil {
		rx.Close()
	}
	d.slot.close()
}

// Expect implements DecodeDataPlane.
func (d *DecodeData) Expect(md Metadata) error {
	d.mu.Lock()
	rx := d.receiver
	d.mu.Unlock()
	region := d.slot.rank(transfer.Rank(md.Rank))
	if rx == nil || region == nil {
		return fmt.Errorf("no region registered for rank %d of %d", md.Rank.TP, md.Rank.Size)
	}
	l := region.Layout()
	// Checked by SendMetadata against this region; the positions below the
	// prefix are decode's already and are never written.
	runs := runsFrom(runsOf(md.DstPages), int64(md.PrefixLen))
	auxRow := int64(md.AuxIndex)
	if l.Aux.Rows == 0 {
		auxRow = -1
	}
	rank := transfer.Rank(md.Rank)
	dst := transfer.SamePages(len(l.Buffers), runs)
	sources, err := slicedSources(l, md.PrefillTP, rank)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrRankMapping, err)
	}
	mk := metaKey{md.Key, rank.TP}
	if sources == nil {
		if err := rx.Expect(transfer.Expectation{Key: tkey(md.Key, rank), Dst: dst, AuxRow: auxRow}); err != nil {
			return err
		}
		d.countPrefillRanks(mk, rank, md.ExpectedRanks)
		return nil
	}
	// Head slices: one expectation per prefill rank feeding this one, each
	// with its own slices of the same pages; the aux row from AuxFrom only.
	// The rank is done once every one completed.
	var keys []transfer.Key
	d.sliced.Lock()
	d.sliced.remaining[mk] = len(sources)
	d.sliced.Unlock()
	for _, src := range sources {
		k := tkey(md.Key, rank)
		k.From = src.rank
		row := int64(-1)
		if src.aux {
			row = auxRow
		}
		if err := rx.Expect(transfer.Expectation{Key: k, Dst: dst, AuxRow: row, Copies: src.copies}); err != nil {
			if slice := headSliceError(err); slice != nil {
				err = slice
			}
			for _, done := range keys {
				rx.Fence(done)
			}
			d.sliced.Lock()
			delete(d.sliced.remaining, mk)
			d.sliced.Unlock()
			return err
		}
		keys = append(keys, k)
	}
	d.sliced.Lock()
	d.sliced.keys[md.Key] = append(d.sliced.keys[md.Key], keys...)
	d.sliced.Unlock()
	d.countPrefillRanks(mk, rank, md.ExpectedRanks)
	return nil
}

// countPrefillRanks records, for a decode rank of TP size 1, how many
// prefill ranks its room's table waits for (expected_senders, the prefill
// TP size): more than the streams that feed the rank when heads are
// replicated or the attention is MLA (doneRanks). Set once the rank's
// expectations are in, before its METADATA leaves, so before any Complete.
func (d *DecodeData) countPrefillRanks(mk metaKey, rank transfer.Rank, ranks int) {
	if rank.Size > 1 || ranks <= 1 {
		return
	}
	d.sliced.Lock()
	d.sliced.prefillRanks[mk] = ranks
	d.sliced.Unlock()
}

// doneRanks is what a decode rank's completion reports to its room: the
// decode rank; or, for a room of one decode rank, whose table counts the
// prefill ranks (R11), every one of them: those the mapping reads from
// have completed, and the others send this rank nothing (replicas of a
// head another rank brought, MLA's dummies), as SGLang's decode does not
// wait for a dummy.
func (d *DecodeData) doneRanks(k transfer.Key) []int {
	if k.Rank.Size > 1 {
		return []int{completedRank(k)}
	}
	mk := metaKey{pkey(k), k.Rank.TP}
	d.sliced.Lock()
	n := d.sliced.prefillRanks[mk]
	delete(d.sliced.prefillRanks, mk)
	d.sliced.Unlock()
	ranks := make([]int, max(n, 1))
	for i := range ranks {
		ranks[i] = i
	}
	return ranks
}

// slicedSource is one prefill rank feeding a decode rank head slices.
type slicedSource struct {
	rank   transfer.Rank
	copies []rankmap.Copy
	aux    bool // the source writes the rank's aux row (Mapping AuxFrom)
}

// slicedSources plans, from decode's own layout and the prefill TP size,
// the prefill ranks that feed decode rank dst head slices (MHA between TP
// sizes), each with its copies; nil when the rank takes whole pages (equal
// TP, MLA, an opaque layout, the prefill TP unknown, or a rank whose row is
// one replicated head: rankmap's DecodeRank.WholePages). Prefill plans the
// same from both real layouts (peerplan.go); a prefill layout other than
// the one decode derives sends slices decode does not expect, and the
// receiver refuses them before a byte lands.
func slicedSources(local transfer.Layout, prefillTP int, dst transfer.Rank) ([]slicedSource, error) {
	if !local.Described() || local.Attention != rankmap.MHA || prefillTP <= 0 || prefillTP == int(local.Rank.Size) {
		return nil, nil
	}
	pre := local
	pre.Rank = transfer.Rank{TP: 0, Size: uint16(prefillTP)}
	pre.Buffers = slices.Clone(local.Buffers)
	var offset int64
	for i := range pre.Buffers {
		b := &pre.Buffers[i]
		pages := b.Length / b.ItemLen
		b.RankHeads = max(b.TotalHeads/int64(prefillTP), 1)
		b.ItemLen = b.PageTokens * b.RankHeads * b.HeadBytes
		b.Offset, b.Length = offset, pages*b.ItemLen // only the shape is planned
		offset += b.Length
	}
	pre.Aux.Offset = offset
	m, err := transfer.PlanRanks(pre, local)
	if err != nil {
		return nil, err
	}
	if int(dst.TP) >= len(m.DecodeRanks) {
		return nil, fmt.Errorf("decode rank %d outside the mapping's %d ranks", dst.TP, len(m.DecodeRanks))
	}
	dr := m.DecodeRanks[dst.TP]
	if dr.WholePages() {
		return nil, nil // prefill sends these as whole pages too (wholePages)
	}
	out := make([]slicedSource, 0, len(dr.From))
	for _, from := range dr.From {
		out = append(out, slicedSource{rank: transfer.Rank{TP: uint16(from), Size: uint16(prefillTP)},
			copies: m.CopiesFrom(from, int(dst.TP)), aux: from == dr.AuxFrom})
	}
	return out, nil
}

// slicedRanks holds the expectations of head-slice streams, which are keyed
// by (decode rank, prefill rank): per room the keys a fence covers, and per
// decode rank the streams still to complete, and per decode rank of TP
// size 1 the prefill ranks its room counts (countPrefillRanks). Its own
// lock: Expect runs on the SendMetadata caller, Complete on a receiver
// goroutine.
type slicedRanks struct {
	sync.Mutex
	keys         map[poll.Key][]transfer.Key
	remaining    map[metaKey]int
	prefillRanks map[metaKey]int
}

// fenceKeys are the room's rank keys plus its head-slice streams' keys.
func (d *DecodeData) fenceKeys(key poll.Key) []transfer.Key {
	keys := d.slot.keys(key)
	d.sliced.Lock()
	keys = append(keys, d.sliced.keys[key]...)
	d.sliced.Unlock()
	return keys
}

// completed reports whether k's completion completes its decode rank: a
// whole-page stream at once, a head-slice stream when its rank's last one.
func (d *DecodeData) completed(k transfer.Key) bool {
	if k.From == (transfer.Rank{}) {
		return true
	}
	mk := metaKey{pkey(k), k.Rank.TP}
	d.sliced.Lock()
	defer d.sliced.Unlock()
	n, ok := d.sliced.remaining[mk]
	if !ok {
		return false
	}
	if n--; n > 0 {
		d.sliced.remaining[mk] = n
		return false
	}
	delete(d.sliced.remaining, mk)
	return true
}

// Fence implements DecodeDataPlane without waiting: the receiver
// stops the room at once and answers done when no byte is being written
// into its pages; otherwise its OnFenced tells the node Fenced once the
// writer let go (within FenceGrace plus one piece), R7.
func (d *DecodeData) Fence(key poll.Key) bool {
	d.mu.Lock()
	rx := d.receiver
	d.mu.Unlock()
	if rx == nil {
		return true
	}
	return d.fences.fence(d.fenceKeys(key), rx.Fence, func() { d.node.Fenced(key) })
}

// Forget implements DecodeDataPlane.
func (d *DecodeData) Forget(key poll.Key) {
	d.Fence(key) // a room reaped unfenced: stop its writes all the same
	d.sliced.Lock()
	delete(d.sliced.keys, key)
	for mk := range d.sliced.remaining {
		if mk.key == key {
			delete(d.sliced.remaining, mk)
		}
	}
	for mk := range d.sliced.prefillRanks {
		if mk.key == key {
			delete(d.sliced.prefillRanks, mk)
		}
	}
	d.sliced.Unlock()
	for k := range d.metadata {
		if k.key == key {
			delete(d.metadata, k)
		}
	}
}

type decodeEvents struct{ d *DecodeData }

func (e decodeEvents) Progress(k transfer.Key, n int64) {
	e.d.bytes.Add(uint64(n))
	e.d.node.OnProgress(pkey(k))
}

func (e decodeEvents) Complete(k transfer.Key) {
	if !e.d.completed(k) {
		return
	}
	for _, rank := range e.d.doneRanks(k) {
		e.d.node.OnRankDone(pkey(k), rank)
	}
}

func (e decodeEvents) Failed(k transfer.Key, r transfer.Reason, err error) {
	e.d.log.Warn("room transfer failed", zap.Inline(k), zap.String("reason", string(r)), zap.Error(err))
	if reason, fails := roomFailure(e.d.log, poll.Decode, r); fails {
		e.d.node.OnFailed(pkey(k), reason)
	}
}

// SubmitMetadata is the scheduler's SendMetadata, checked against the
// region: a retry of the same request (a client timeout) is answered as
// the first call was (nil once it took effect) whatever state the room
// moved on to, unless it Failed; other metadata for a room that has some
// is refused with ErrMetadataConflict naming the field that differs. The
// rank was checked at the edge.
func (n *DecodeOwner) SubmitMetadata(ctx context.Context, req *pdlinkv1.SendMetadataRequest) error {
	d := n.data
	if err := d.slot.checkRank("rank", req.Rank); err != nil {
		return err
	}
	region := d.slot.rank(transferRank(req.Rank))
	if region == nil {
		return ErrNoRegion // unregistered since the check
	}
	if m := region.Current(); m != nil {
		if reason, stale := d.slot.stale(transferRank(req.Rank), m); stale {
			// The engine recreated (or truncated) its file and has not
			// registered it: these pages would be written into the dead inode.
			return n.failStale(ctx, poll.RoomID(req.RoomId), transferRank(req.Rank), reason)
		}
	}
	l := region.Layout()
	dst, err := pageRuns("dst_pages", req.DstPages, l.Buffers[0].Pages())
	if err != nil {
		return err
	}
	if l.Aux.Rows > 0 && int64(req.AuxIndex) >= l.Aux.Rows {
		return invalid("aux_index", "row %d of %d", req.AuxIndex, l.Aux.Rows)
	}
	if n := transfer.CountPages(dst); int64(req.PrefixLen) > n {
		return invalid("prefix_len", "%d positions, but dst_pages has %d", req.PrefixLen, n)
	}
	rank := transferRank(req.Rank)
	mr := MetadataRequest{DstPages: req.DstPages, AuxIndex: req.AuxIndex, PrefixLen: req.PrefixLen, Rank: Rank(rank)}
	id := poll.RoomID(req.RoomId)
	want := &sentMetadata{rank: rank, dst: dst, auxIndex: req.AuxIndex, prefixLen: req.PrefixLen, done: make(chan struct{})}
	var in poll.RoomInfo
	var md *sentMetadata
	var first bool
	// The room's state and its recorded metadata in one owner input: a
	// claim is only ever made for a key in the table, so Forget drops it.
	if !n.execOwned(func() {
		n.withTable(func() { in, err = n.t.Get(id) })
		if err == nil && in.State != poll.Failed {
			md, first = d.claimMetadata(in.Key, want)
		}
	}) {
		return conn.ErrClosedNode
	}
	if err != nil {
		return err
	}
	if in.State == poll.Failed {
		return &EndedError{Info: in} // also for a retry: the room takes nothing now
	}
	if !first {
		if field := md.conflict(want); field != "" {
			return errorf(ErrMetadataConflict, "room %d already has metadata with another %s: a retry must repeat the first request", id, field)
		}
		select { // the same request: answer as the first call does
		case <-md.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		return md.err
	}
	err = n.SendMetadata(id, mr)
	n.exec(func() { d.settleMetadata(in.Key, want, err) })
	return err
}

// failStale fails a room whose region file changed under it with reason
// (the peer is told) and answers with its state.
func (n *DecodeOwner) failStale(ctx context.Context, id poll.RoomID, rank transfer.Rank, reason poll.Reason) error {
	if err := n.abortThen(ctx, id, reason, n.data.slot.countedFailure(rank, reason)); err != nil {
		return err
	}
	in, err := n.Get(id)
	if err != nil {
		return err
	}
	return &EndedError{Info: in}
}

// HasRegion reports whether a region is registered.
func (n *DecodeOwner) HasRegion() bool { return n.data.slot.get() != nil }

// ServeData hands every accepted data connection to the receiver until ln
// closes.
func (n *DecodeOwner) ServeData(ln net.Listener) error { return n.data.Serve(ln) }

// Bytes is the KV bytes written and verified.
func (n *DecodeOwner) Bytes() uint64 { return n.data.Bytes() }

// DataRefused is how many data frames the receiver refused for reason,
// one of DataRefusalReasons (pdlink_data_refused_total).
func (n *DecodeOwner) DataRefused(reason string) uint64 {
	for _, r := range transfer.AllRefusals() {
		if r.String() == reason {
			return n.data.DataRefused(r)
		}
	}
	return 0
}

// DataRefusalReasons is the closed set of DataRefused's reasons.
func DataRefusalReasons() []string {
	var out []string
	for _, r := range transfer.AllRefusals() {
		out = append(out, r.String())
	}
	return out
}
