package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/internal/sim"
	"github.com/pdlink/pdlink/internal/testbed"
	"github.com/pdlink/pdlink/pkg/rankmap"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// Issue 15 on real daemon processes: an engine restart deletes its region
// file, creates a new one at the same path and registers it again (or
// unregisters). The in-process versions are in
// internal/service/regionlife_test.go; these run prefilld and decoded as
// children over loopback with a simulated scheduler on each side.

// streamLayout is small enough that 200 rooms run in seconds under -race
// on two loaded cores, with 32 slots of 8 pages (a room each) per region.
var streamLayout = transfer.UniformLayout(2, 256, 16<<10, 32, 64)

const (
	slotPages     = 8
	chunkPages    = 2
	restartJunk   = 0x3C // every byte of a recreated file: a restarted engine's memory
	decodeUnwrote = 0xA5 // a destination page not written yet
)

func slotOf(slot int) []int32 {
	out := make([]int32, slotPages)
	for i := range out {
		out[i] = int32(slot*slotPages + i)
	}
	return out
}

// patternWord is unique to the room, buffer, position in the room and
// word, so a stale, misplaced or foreign page never matches.
func patternWord(room uint64, buf, pos, word int) uint64 {
	return room*0x9E3779B97F4A7C15 ^ uint64(buf)<<48 ^ uint64(pos)<<24 ^ uint64(word)
}

func fillRoom(r *transfer.Region, room uint64, pages []int32, aux int64) {
	for b := range r.Layout().Buffers {
		for pos, pg := range pages {
			p := r.Pages(b, transfer.Run{Start: pg, Count: 1})
			for w := 0; w+8 <= len(p); w += 8 {
				binary.LittleEndian.PutUint64(p[w:], patternWord(room, b, pos, w/8))
			}
		}
	}
	row := r.AuxRow(aux)
	clear(row)
	copy(row, fmt.Sprintf("aux-of-room-%d", room))
}

// roomLanded reports whether pages and aux hold room's pattern.
func roomLanded(r *transfer.Region, room uint64, pages []int32, aux int64) bool {
	for b := range r.Layout().Buffers {
		for pos, pg := range pages {
			p := r.Pages(b, transfer.Run{Start: pg, Count: 1})
			for w := 0; w+8 <= len(p); w += 8 {
				if binary.LittleEndian.Uint64(p[w:]) != patternWord(room, b, pos, w/8) {
					return false
				}
			}
		}
	}
	want := make([]byte, len(r.AuxRow(aux)))
	copy(want, fmt.Sprintf("aux-of-room-%d", room))
	return bytes.Equal(r.AuxRow(aux), want)
}

func fillPagesWith(r *transfer.Region, pages []int32, aux int64, v byte) {
	for b := range r.Layout().Buffers {
		for _, pg := range pages {
			p := r.Pages(b, transfer.Run{Start: pg, Count: 1})
			for i := range p {
				p[i] = v
			}
		}
	}
	row := r.AuxRow(aux)
	for i := range row {
		row[i] = v
	}
}

// snapshotPages copies pages and the aux row of r.
func snapshotPages(r *transfer.Region, pages []int32, aux int64) []byte {
	var out []byte
	for b := range r.Layout().Buffers {
		for _, pg := range pages {
			out = append(out, r.Pages(b, transfer.Run{Start: pg, Count: 1})...)
		}
	}
	return append(out, r.AuxRow(aux)...)
}

// recreateRegionFile does what a restarting engine with a fixed file name
// does: delete the file, create a new one at the same path (a new inode)
// holding other bytes, and map it.
func recreateRegionFile(t *testing.T, path string, layout transfer.Layout) *transfer.Region {
	t.Helper()
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(layout.Size()); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	r, err := transfer.OpenRegion(path, layout)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	for b := range layout.Buffers {
		buf := r.Buffer(b)
		for i := range buf {
			buf[i] = restartJunk
		}
	}
	return r
}

func rankOf(rank, size int) *pb.Rank { return &pb.Rank{TpRank: uint32(rank), TpSize: uint32(size)} }

// rankLayout is streamLayout as TP rank rank of a size-rank engine maps it.
func rankLayout(rank, size int) transfer.Layout {
	l := streamLayout
	l.Rank = transfer.Rank{TP: uint16(rank), Size: uint16(size)}
	return l
}

// headStreamLayout is streamLayout's pages and aux rows with a head
// shape: 4 KV heads of 64 bf16 values per token row, 16-token pages, so
// MHA ranks hold head slices (2 heads at TP 2, 1 at TP 4) and MLA ranks
// the whole latent.
var headStreamLayout = sim.Layout{Layers: 1, PageTokens: 16, BytesPerToken: 1024, Pages: 256, AuxRows: 32, AuxRowLen: 64,
	HeadDim: 64, DtypeBytes: 2}

// restartTopo is the stream's two engines: their TP sizes and attention
// ("" for streamLayout's opaque pages at equal TP, "mla" or "mha" for
// headStreamLayout's heads).
type restartTopo struct {
	prefillTP, decodeTP int
	attention           string
}

func (c restartTopo) tp(side string) int {
	if side == "prefill" {
		return c.prefillTP
	}
	return c.decodeTP
}

// layout is what side's rank maps.
func (c restartTopo) layout(t *testing.T, side string, rank int) transfer.Layout {
	t.Helper()
	if c.attention == "" {
		return rankLayout(rank, c.tp(side))
	}
	l := headStreamLayout
	l.MLA = c.attention == "mla"
	tl, err := l.RankTransfer(rank, c.tp(side))
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

// rankRoom is the pattern seed of rank's share of room: each rank's pages
// hold their own bytes, so a page landing on the wrong rank never matches.
func rankRoom(room uint64, rank int) uint64 { return room ^ uint64(rank)<<40 }

// addRank creates and registers rank's region file of layout l on side
// of p (ranks above 0: newOwnerPair made rank 0's).
func addRank(t *testing.T, p *ownerPair, side string, l transfer.Layout) *rankFile {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	path, err := transfer.CreateRegionFile(regionDir(t), l)
	if err != nil {
		t.Fatal(err)
	}
	r, err := transfer.OpenRegion(path, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	registerOn(ctx, t, p.prefill, p.decode, side, path, l)
	return &rankFile{path: path, gens: []*transfer.Region{r}}
}

// registered is RegisterRegion's answer, either side.
type registered struct {
	gen, inode  uint64
	roomsFailed uint32
}

func registerOn(ctx context.Context, t *testing.T, prefill pb.PrefillServiceClient, decode pb.DecodeServiceClient, side, path string, layout transfer.Layout) registered {
	t.Helper()
	lp := layoutProtoOf(layout)
	if side == "prefill" {
		r, err := prefill.RegisterRegion(ctx, &pb.PrefillServiceRegisterRegionRequest{RegionPath: path, Layout: lp})
		if err != nil {
			t.Fatalf("prefill RegisterRegion: %v", err)
		}
		return registered{r.Generation, r.Inode, r.RoomsFailed}
	}
	r, err := decode.RegisterRegion(ctx, &pb.DecodeServiceRegisterRegionRequest{RegionPath: path, Layout: lp})
	if err != nil {
		t.Fatalf("decode RegisterRegion: %v", err)
	}
	return registered{r.Generation, r.Inode, r.RoomsFailed}
}

// replacedCounters scrapes, per side, pdlink_region_replaced_total and
// pdlink_room_failures_total{reason="region_replaced"}.
func replacedCounters(t *testing.T, p *ownerPair) map[string][2]float64 {
	t.Helper()
	out := map[string][2]float64{}
	for side, addr := range map[string]string{"prefill": p.pre.HTTPAddr, "decode": p.dec.HTTPAddr} {
		out[side] = [2]float64{
			metric(t, addr, `pdlink_region_replaced_total{side="`+side+`"}`),
			metric(t, addr, `pdlink_room_failures_total{reason="region_replaced",side="`+side+`"}`),
		}
	}
	return out
}

// replacedOutcome reports whether the room ended as a region replacement
// on side does: Failed region_replaced there, aborted:remote naming
// region_replaced on the peer.
func replacedOutcome(side string, ps, ds *pb.RoomStatus) bool {
	own, peer := ps, ds
	if side == "decode" {
		own, peer = ds, ps
	}
	return own.GetState() == pb.RoomState_ROOM_STATE_FAILED && own.GetReason() == "region_replaced" &&
		peer.GetState() == pb.RoomState_ROOM_STATE_FAILED && peer.GetReason() == "aborted:remote" && peer.GetPeerReason() == "region_replaced"
}

func otherSide(side string) string {
	if side == "prefill" {
		return "decode"
	}
	return "prefill"
}

func terminal(s *pb.RoomStatus) bool {
	return s.GetState() == pb.RoomState_ROOM_STATE_SUCCESS || s.GetState() == pb.RoomState_ROOM_STATE_FAILED
}

// rankFile is one rank's region file on one side and every generation the
// engine mapped at its path (old ones stay mapped so their bytes can be
// checked after the daemon dropped them).
type rankFile struct {
	path string
	gens []*transfer.Region
}

func (f *rankFile) current() (int, *transfer.Region) { return len(f.gens), f.gens[len(f.gens)-1] }

// streamRoom is one room of the stream, as its schedulers (one per rank
// and side) saw it. The room spans every rank, in the same slot of each
// rank's region.
type streamRoom struct {
	id             uint64
	slot           int
	preGen, decGen []int // by rank: the generation the room's pages live in
	// chunksSent and stopped are written by the room's goroutine under
	// engines.mu read-locked; the restart reads them write-locked.
	chunksSent []int             // by prefill rank
	stopped    map[string][]bool // side -> rank: that rank's engine restarted under it, it called no more
	// midTransferAtRestart: the restarted rank had sent some chunks, not
	// its last, when its engine restarted. Such a room can only end failed.
	midTransferAtRestart bool

	final          [2]*pb.RoomStatus // prefill, decode
	failedSnapshot []byte            // decode's pages (every rank's) when decode's Failed was first visible
	problem        string
}

// oldGen reports whether every page of the room lives in a first generation.
func (rm *streamRoom) oldGen() bool {
	return !slices.ContainsFunc(slices.Concat(rm.preGen, rm.decGen), func(gen int) bool { return gen != 1 })
}

func (rm *streamRoom) anyStopped() bool {
	return slices.Contains(rm.stopped["prefill"], true) || slices.Contains(rm.stopped["decode"], true)
}

// allSent reports whether every rank sent its last chunk.
func (rm *streamRoom) allSent() bool {
	for _, n := range rm.chunksSent {
		if n < slotPages/chunkPages {
			return false
		}
	}
	return true
}

// restartStream is a bounded stream of rooms between two real daemons,
// each scheduler calling into its engine under engines.mu read-locked,
// so that restart, write-locked, sees no room call half done.
type restartStream struct {
	t    *testing.T
	p    *ownerPair
	topo restartTopo
	// plan is which prefill ranks' head slices land on each decode rank,
	// as the daemons plan it; expectedSenders is the prefill TP size
	// (OpenReceiverRequest.expected_senders), as the sim's schedulers and
	// SGLang's decode name it.
	plan            rankmap.Mapping
	expectedSenders uint32
	engMu           sync.RWMutex
	files           map[string][]*rankFile // side -> rank -> file
	slots           chan int
	tick            time.Duration
	bound           time.Duration
	nextID          atomic.Uint64
	done            atomic.Int64
	// starved is set once no slot came free within bound.
	starved atomic.Bool

	mu    sync.Mutex
	rooms []*streamRoom
}

// newRestartStream starts the daemons on data transport kind with every
// rank of topo registered on each side.
func newRestartStream(t *testing.T, topo restartTopo, kind transfer.Kind) *restartStream {
	pre0, dec0 := topo.layout(t, "prefill", 0), topo.layout(t, "decode", 0)
	plan, err := transfer.PlanRanks(pre0, dec0)
	if err != nil {
		t.Fatalf("%+v: %v", topo, err)
	}
	p := newOwnerPairOf(t, pre0, dec0, transportArgs(kind), transportArgs(kind))
	s := &restartStream{t: t, p: p, topo: topo, plan: plan, tick: 2 * time.Millisecond, bound: 30 * time.Second,
		files: map[string][]*rankFile{
			"prefill": {{path: p.srcPath, gens: []*transfer.Region{p.src}}},
			"decode":  {{path: p.dstPath, gens: []*transfer.Region{p.dst}}},
		}}
	for _, side := range []string{"prefill", "decode"} {
		for rank := 1; rank < topo.tp(side); rank++ {
			s.files[side] = append(s.files[side], addRank(t, p, side, topo.layout(t, side, rank)))
		}
	}
	if topo.prefillTP > 1 || topo.decodeTP > 1 {
		s.expectedSenders = uint32(topo.prefillTP)
	}
	n := int(pre0.Buffers[0].Pages()) / slotPages
	s.slots = make(chan int, n)
	for i := range n {
		s.slots <- i
	}
	s.nextID.Store(1000)
	return s
}

func (s *restartStream) poll(ctx context.Context, room uint64) (ps, ds *pb.RoomStatus, err error) {
	pr, err := s.p.prefill.Poll(ctx, &pb.PrefillServicePollRequest{RoomIds: []uint64{room}})
	if err != nil {
		return nil, nil, err
	}
	dr, err := s.p.decode.Poll(ctx, &pb.DecodeServicePollRequest{RoomIds: []uint64{room}})
	if err != nil {
		return nil, nil, err
	}
	return pr.Statuses[0], dr.Statuses[0], nil
}

// engineCall runs f, side's rank's scheduler calling, with the engines
// read-locked unless that engine restarted since the room's pages were
// filled (it dropped the room); it reports whether f ran.
func (s *restartStream) engineCall(rm *streamRoom, side string, rank int, f func()) bool {
	s.engMu.RLock()
	defer s.engMu.RUnlock()
	gen, _ := s.files[side][rank].current()
	if gen != rm.gens(side)[rank] {
		rm.stopped[side][rank] = true
		return false
	}
	f()
	return true
}

func (rm *streamRoom) gens(side string) []int {
	if side == "prefill" {
		return rm.preGen
	}
	return rm.decGen
}

// serve runs one room on every rank as the ranks' scheduler pairs do:
// fill each rank's source, open both sides on every rank, bind every
// rank, send each rank's pages in chunks with a poll between them, poll to
// the end, verify every rank, clear. A rank whose engine restarted sends
// nothing more, and the room is aborted unless the daemon failed it.
func (s *restartStream) serve(ctx context.Context) {
	preTP, decTP := s.topo.prefillTP, s.topo.decodeTP
	rm := &streamRoom{id: s.nextID.Add(1), preGen: make([]int, preTP), decGen: make([]int, decTP),
		chunksSent: make([]int, preTP), stopped: map[string][]bool{"prefill": make([]bool, preTP), "decode": make([]bool, decTP)}}
	if s.starved.Load() {
		return
	}
	select {
	case rm.slot = <-s.slots:
	case <-time.After(s.bound):
		// Every slot is held by a room kept as evidence (wrong bytes, or
		// not ended): the run is failing already, so the rest is skipped.
		if !s.starved.Swap(true) {
			s.t.Errorf("no free slot within %v: every slot holds a room that went wrong", s.bound)
		}
		return
	}
	s.mu.Lock()
	s.rooms = append(s.rooms, rm)
	s.mu.Unlock()
	pages, aux := slotOf(rm.slot), int64(rm.slot)
	s.engMu.RLock()
	for rank := range preTP {
		var src *transfer.Region
		rm.preGen[rank], src = s.files["prefill"][rank].current()
		fillRoom(src, rankRoom(rm.id, rank), pages, aux)
	}
	for rank := range decTP {
		var dst *transfer.Region
		rm.decGen[rank], dst = s.files["decode"][rank].current()
		fillPagesWith(dst, pages, aux, decodeUnwrote)
	}
	s.engMu.RUnlock()

	fail := func(format string, args ...any) { rm.problem = fmt.Sprintf(format, args...) }
	for rank := range decTP {
		if _, err := s.p.decode.OpenReceiver(ctx, s.openReceiver(rm.id, rank)); err != nil {
			fail("OpenReceiver rank %d: %v", rank, err)
			return
		}
	}
	for rank := range preTP {
		if _, err := s.p.prefill.OpenSender(ctx, s.openSender(rm.id, rank)); err != nil {
			fail("OpenSender rank %d: %v", rank, err)
			return
		}
	}
	var callErr error
	for rank := range decTP {
		s.engineCall(rm, "decode", rank, func() {
			if _, err := s.p.decode.SendMetadata(ctx, &pb.SendMetadataRequest{RoomId: rm.id, Rank: s.rank("decode", rank),
				DstPages: &pb.PageList{Indices: pages}, AuxIndex: uint32(aux)}); err != nil && callErr == nil {
				callErr = err
			}
		})
	}
	if callErr == nil && !rm.anyStopped() {
		s.waitUntil(ctx, rm, func(ps, _ *pb.RoomStatus) bool {
			return ps.GetState() == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT || terminal(ps)
		})
	}
	for c := 0; callErr == nil && c*chunkPages < slotPages; c++ {
		last := (c+1)*chunkPages >= slotPages
		for rank := range preTP {
			if rm.stopped["prefill"][rank] {
				continue // the other ranks' schedulers go on
			}
			req := &pb.SendRequest{RoomId: rm.id, Rank: s.rank("prefill", rank), StartPosition: uint32(c * chunkPages),
				Pages: &pb.PageList{Indices: pages[c*chunkPages : (c+1)*chunkPages]}, Last: last}
			if last {
				req.AuxIndex = uint32(aux)
			}
			s.engineCall(rm, "prefill", rank, func() {
				if _, callErr = s.p.prefill.Send(ctx, req); callErr == nil {
					rm.chunksSent[rank]++
				}
			})
			if callErr != nil {
				break
			}
		}
		if !last && callErr == nil {
			if _, _, err := s.poll(ctx, rm.id); err != nil { // a scheduler tick between chunks
				fail("Poll: %v", err)
				return
			}
		}
	}
	if callErr != nil && status.Code(callErr) != codes.FailedPrecondition {
		fail("a call of the room: %v", callErr) // FailedPrecondition: the room failed, its state says why
	}
	if rm.anyStopped() {
		// The restarted engine dropped the room; the daemon failed it if
		// it held data-plane state on the old file, else the scheduler
		// aborts it (an abort of a failed room changes nothing).
		if ps, _, err := s.poll(ctx, rm.id); err == nil && !terminal(ps) {
			_, _ = s.p.prefill.Abort(ctx, &pb.PrefillServiceAbortRequest{RoomId: rm.id})
			_, _ = s.p.decode.Abort(ctx, &pb.DecodeServiceAbortRequest{RoomId: rm.id})
		}
	}
	s.waitUntil(ctx, rm, func(ps, ds *pb.RoomStatus) bool { return terminal(ps) && terminal(ds) })
	if rm.final[0] == nil {
		return
	}
	if rm.final[1].GetState() == pb.RoomState_ROOM_STATE_SUCCESS {
		s.engMu.RLock()
		var wrong []int
		for rank := range decTP {
			if !s.rankLanded(rm, rank) {
				wrong = append(wrong, rank)
			}
		}
		s.engMu.RUnlock()
		if len(wrong) > 0 {
			fail("decode Success with bytes that differ from the source on ranks %v (prefill gens %v, decode gens %v)", wrong, rm.preGen, rm.decGen)
			return // the slot stays out: its bytes are evidence
		}
		s.slots <- rm.slot
	}
	// A failed room's slot is never reused: its decode pages are compared
	// with their snapshot after the run.
	_, _ = s.p.prefill.Clear(ctx, &pb.PrefillServiceClearRequest{RoomIds: []uint64{rm.id}})
	_, _ = s.p.decode.Clear(ctx, &pb.DecodeServiceClearRequest{RoomIds: []uint64{rm.id}})
}

// rank is what a call of side's rank's scheduler names: nil at TP 1, as
// before ranks.
func (s *restartStream) rank(side string, rank int) *pb.Rank {
	if s.topo.tp(side) == 1 {
		return nil
	}
	return rankOf(rank, s.topo.tp(side))
}

// rankLanded reports whether decode rank's pages and aux row of the room,
// in the generation they live in, hold exactly what the mapping takes from
// the prefill ranks it names (each prefill rank's pages in its own
// generation): sim.PageLanded, the check the simulated schedulers make, and
// the source pages hold the room's pattern. Under engMu read-locked.
func (s *restartStream) rankLanded(rm *streamRoom, rank int) bool {
	pages, aux := slotOf(rm.slot), int64(rm.slot)
	source := func(from int) *transfer.Region { return s.files["prefill"][from].gens[rm.preGen[from]-1] }
	dst := s.files["decode"][rank].gens[rm.decGen[rank]-1]
	dr := s.plan.DecodeRanks[rank]
	for _, from := range dr.From {
		if !roomLanded(source(from), rankRoom(rm.id, from), pages, aux) {
			return false // a source overwritten: nothing to compare with
		}
	}
	for b := range dst.Layout().Buffers {
		for _, pg := range pages {
			at := transfer.Run{Start: pg, Count: 1}
			if !sim.PageLanded(dr, b, dst.Pages(b, at), func(from int) []byte { return source(from).Pages(b, at) }) {
				return false
			}
		}
	}
	return bytes.Equal(dst.AuxRow(aux), source(dr.AuxFrom).AuxRow(aux))
}

// snapshotRoom copies the room's decode pages and aux rows on every rank,
// in the generations they live in. Under engMu read-locked.
func (s *restartStream) snapshotRoom(rm *streamRoom) []byte {
	var out []byte
	for rank := range s.topo.decodeTP {
		out = append(out, snapshotPages(s.files["decode"][rank].gens[rm.decGen[rank]-1], slotOf(rm.slot), int64(rm.slot))...)
	}
	return out
}

// waitUntil polls the room every tick until cond holds (bounded), keeping
// its last statuses and snapshotting decode's pages when decode first
// shows Failed.
func (s *restartStream) waitUntil(ctx context.Context, rm *streamRoom, cond func(ps, ds *pb.RoomStatus) bool) {
	deadline := time.Now().Add(s.bound)
	for {
		ps, ds, err := s.poll(ctx, rm.id)
		if err != nil {
			rm.problem = fmt.Sprintf("Poll: %v", err)
			return
		}
		if rm.failedSnapshot == nil && ds.GetState() == pb.RoomState_ROOM_STATE_FAILED {
			s.engMu.RLock()
			rm.failedSnapshot = s.snapshotRoom(rm)
			s.engMu.RUnlock()
		}
		rm.final = [2]*pb.RoomStatus{ps, ds}
		if cond(ps, ds) {
			return
		}
		if time.Now().After(deadline) {
			rm.problem = fmt.Sprintf("not done within %v: prefill %v, decode %v", s.bound, ps, ds)
			rm.final = [2]*pb.RoomStatus{}
			return
		}
		time.Sleep(s.tick) // a scheduler's poll interval, as SGLang's loop polls
	}
}

// run serves n rooms, concurrency at a time, calling restart once
// restartAfter rooms ended.
func (s *restartStream) run(ctx context.Context, n, concurrency, restartAfter int, restart func()) {
	next := make(chan struct{}, n)
	for range n {
		next <- struct{}{}
	}
	close(next)
	var wg sync.WaitGroup
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				s.serve(ctx)
				s.done.Add(1)
			}
		}()
	}
	if _, ok := testbed.Eventually(s.bound, func() bool { return s.done.Load() >= int64(restartAfter) }); !ok {
		s.t.Errorf("only %d of %d rooms ended before the restart", s.done.Load(), restartAfter)
	}
	restart()
	wg.Wait()
}

// restartEngine waits (bounded) until some room is mid-transfer on side's
// rank with the engines locked, so no room call is half done, then plays
// the restart of that engine: recreate its file, register it, and mark
// the rooms it caught. Mid-transfer on a prefill rank is its own chunks
// part sent; on a decode rank, a prefill rank feeding it part sent (its
// metadata is bound then: prefill waits for every decode rank's).
func (s *restartStream) restartEngine(ctx context.Context, side string, rank int) (registered, []*streamRoom) {
	t := s.t
	t.Helper()
	feeders := []int{rank}
	if side == "decode" {
		feeders = s.plan.DecodeRanks[rank].From
	}
	var caught []*streamRoom
	deadline := time.Now().Add(s.bound)
	for {
		s.engMu.Lock()
		s.mu.Lock()
		caught = caught[:0]
		for _, rm := range s.rooms {
			if slices.ContainsFunc(feeders, func(from int) bool {
				n := rm.chunksSent[from]
				return n > 0 && n < slotPages/chunkPages
			}) {
				caught = append(caught, rm)
			}
		}
		s.mu.Unlock()
		if len(caught) > 0 {
			break
		}
		s.engMu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("no room was mid-transfer when the engine was to restart")
		}
		// Polled by hand, not with testbed.Eventually: the check must
		// leave the engines locked when it holds.
		time.Sleep(time.Millisecond)
	}
	defer s.engMu.Unlock()
	for _, rm := range caught {
		rm.midTransferAtRestart = true
	}
	f := s.files[side][rank]
	l := s.topo.layout(t, side, rank)
	f.gens = append(f.gens, recreateRegionFile(t, f.path, l))
	return registerOn(ctx, t, s.p.prefill, s.p.decode, side, f.path, l), caught
}

// TestEngineRestartMidRunFailsOnlyItsRoomsAndNewRoomsSucceed: a stream of
// 200 rooms with verified bytes, at TP 1, 2 -> 2 and 4 -> 4 (each room on
// every rank, each rank its own region file); after 60 the engine of the
// last rank on one side restarts (new file at the same path, RegisterRegion
// again) while rooms are mid-transfer on it. Every room caught mid-transfer
// on that rank fails region_replaced on that side and
// aborted:remote/region_replaced on the other, never Success (a room spans
// every rank, so it fails whole); no room reports Success with bytes on any
// rank that differ from that rank's source; rooms opened after the restart
// succeed with their bytes in the new file and the other ranks' files;
// decode pages of failed rooms, on every rank, do not change after Failed
// is visible; the counters move by one replacement and the rooms it failed.
// At TP 2 and 4 a witness room, bound on every rank but the restarted one
// when it restarts, succeeds over the new file: the replacement fails only
// the rooms holding state on the replaced rank (a daemon that retires every
// rank's rooms fails it).
func TestEngineRestartMidRunFailsOnlyItsRoomsAndNewRoomsSucceed(t *testing.T) {
	const rooms, concurrency, restartAfter = 200, 8, 60
	onEachTransport(t, func(t *testing.T, kind transfer.Kind) {
		for _, tp := range []int{1, 2, 4} {
			for _, side := range []string{"prefill", "decode"} {
				name := side
				if tp > 1 {
					name = fmt.Sprintf("tp%d/%s", tp, side)
				}
				t.Run(name, func(t *testing.T) {
					restartMidRun(t, restartTopo{prefillTP: tp, decodeTP: tp}, kind, side, rooms, concurrency, restartAfter)
				})
			}
		}
	})
}

// TestEngineRestartMidRunAtEachMappingFailsOnlyItsRooms is the same
// stream and the same assertions with head-described layouts between TP
// sizes: MLA 2 -> 4 and 4 -> 2 (each decode rank fed whole pages by one
// prefill rank, 4 -> 2 with dummy ranks), MHA 2 -> 4 and 4 -> 2 (head
// slices split or merged); each decode rank's bytes checked against the
// prefill ranks' head slices transfer.PlanRanks names (sim.PageLanded).
// The last prefill rank that feeds some decode rank restarts, or as a
// separate case the last decode rank: the rooms caught mid-transfer on it
// fail region_replaced (a room spans every rank), rooms not on it are
// untouched (the witness room, bound on the other ranks at the restart,
// succeeds), rooms opened after succeed over the new file, failed rooms'
// decode pages do not change after Failed is visible.
func TestEngineRestartMidRunAtEachMappingFailsOnlyItsRooms(t *testing.T) {
	const rooms, concurrency, restartAfter = 100, 8, 30
	onEachTransport(t, func(t *testing.T, kind transfer.Kind) {
		for _, c := range []restartTopo{{2, 4, "mla"}, {4, 2, "mla"}, {2, 4, "mha"}, {4, 2, "mha"}} {
			for _, side := range []string{"prefill", "decode"} {
				t.Run(fmt.Sprintf("%s_%d_to_%d/%s", c.attention, c.prefillTP, c.decodeTP, side), func(t *testing.T) {
					restartMidRun(t, c, kind, side, rooms, concurrency, restartAfter)
				})
			}
		}
	})
}

// restartedRank is the rank of side whose engine the stream restarts: the
// last one that holds data-plane state for a room (a prefill rank that
// feeds some decode rank; a dummy has no binding to fail).
func (s *restartStream) restartedRank(side string) int {
	if side == "decode" {
		return s.topo.decodeTP - 1
	}
	for r := s.topo.prefillTP - 1; r > 0; r-- {
		if len(s.plan.PrefillRanks[r].To) > 0 {
			return r
		}
	}
	return 0
}

func restartMidRun(t *testing.T, topo restartTopo, kind transfer.Kind, side string, rooms, concurrency, restartAfter int) {
	s := newRestartStream(t, topo, kind)
	restarted := s.restartedRank(side)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	before := replacedCounters(t, s.p)
	_, oldFile := s.files[side][restarted].current()
	oldInode := oldFile.ID().Ino
	var reg registered
	var caught []*streamRoom
	var w *witness
	s.run(ctx, rooms, concurrency, restartAfter, func() {
		w = s.openWitness(ctx, side, restarted)
		reg, caught = s.restartEngine(ctx, side, restarted)
	})
	if w != nil {
		s.finishWitness(ctx, w, side, restarted)
	}
	if reg.gen != 2 || reg.inode == oldInode {
		t.Errorf("re-register of the recreated file: generation %d inode %d (was %d), want generation 2 and a new inode", reg.gen, reg.inode, oldInode)
	}

	var replaced, succeededAfter, openedAfter int
	for _, rm := range s.rooms {
		if rm.problem != "" {
			t.Errorf("room %d: %s", rm.id, rm.problem)
			continue
		}
		ps, ds := rm.final[0], rm.final[1]
		oldGen := rm.oldGen()
		succeeded := ps.GetState() == pb.RoomState_ROOM_STATE_SUCCESS && ds.GetState() == pb.RoomState_ROOM_STATE_SUCCESS
		switch {
		case replacedOutcome(side, ps, ds):
			replaced++
			if !oldGen {
				t.Errorf("room %d opened after the restart failed region_replaced", rm.id)
			}
		case rm.midTransferAtRestart:
			t.Errorf("room %d was mid-transfer at the restart and ended prefill %v, decode %v; want region_replaced", rm.id, ps, ds)
		case !oldGen:
			openedAfter++
			if !succeeded {
				t.Errorf("room %d opened after the restart did not succeed: prefill %v, decode %v", rm.id, ps, ds)
			} else {
				succeededAfter++
			}
		case succeeded && !rm.allSent():
			t.Errorf("room %d reached Success though some rank never sent its last chunk (sent %v)", rm.id, rm.chunksSent)
		case succeeded, rm.anyStopped() && ps.GetReason() == "aborted:local":
		default:
			t.Errorf("room %d of the old generation ended prefill %v, decode %v", rm.id, ps, ds)
		}
		if rm.failedSnapshot != nil {
			if !bytes.Equal(s.snapshotRoom(rm), rm.failedSnapshot) {
				t.Errorf("room %d: decode pages changed after its Failed was visible", rm.id)
			}
		}
	}
	t.Logf("%d rooms: %d caught mid-transfer, %d failed region_replaced (register said %d), %d opened after the restart, %d of them succeeded",
		len(s.rooms), len(caught), replaced, reg.roomsFailed, openedAfter, succeededAfter)
	if replaced < len(caught) || uint32(replaced) != reg.roomsFailed {
		t.Errorf("%d rooms failed region_replaced; %d were caught mid-transfer and RegisterRegion said %d", replaced, len(caught), reg.roomsFailed)
	}
	if openedAfter < rooms/4 { // the restart waits for a room mid-transfer while others end
		t.Errorf("only %d rooms opened after the restart", openedAfter)
	}
	after := replacedCounters(t, s.p)
	if d := after[side][0] - before[side][0]; d != 1 {
		t.Errorf("pdlink_region_replaced_total on %s moved by %v, want 1", side, d)
	}
	if d := after[otherSide(side)][0] - before[otherSide(side)][0]; d != 0 {
		t.Errorf("pdlink_region_replaced_total on %s moved by %v, want 0", otherSide(side), d)
	}
	if d := after[side][1] - before[side][1]; d != float64(replaced) {
		t.Errorf(`pdlink_room_failures_total{reason="region_replaced"} on %s moved by %v, want %d`, side, d, replaced)
	}
}

// restartPair is an ownerPair of streamLayout played one call at a time
// for the recreate and unregister scenarios.
type restartPair struct {
	*ownerPair
	ctx context.Context
}

func newRestartPair(t *testing.T, kind transfer.Kind) *restartPair {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return &restartPair{newOwnerPair(t, streamLayout, transportArgs(kind), transportArgs(kind)), ctx}
}

// onEachTransport runs f as a subtest per data transport: TCP pages, and
// same-host pages only (shm: a room decode cannot map fails rather than
// fall back, so these runs copy from the prefill files). On the same-host
// path decoded stats the prefill file before each chunk it copies and may
// see a replaced file before prefill's RegisterRegion does; the reasons and
// counts must not tell the two transports apart.
func onEachTransport(t *testing.T, f func(t *testing.T, kind transfer.Kind)) {
	for _, kind := range []transfer.Kind{transfer.KindTCP, transfer.KindShm} {
		t.Run(string(kind), func(t *testing.T) { f(t, kind) })
	}
}

// transportArgs is the daemon flag selecting kind's data transport.
func transportArgs(kind transfer.Kind) []string { return []string{"--data-transport=" + string(kind)} }

// openBound fills room's source in slot, opens it on both sides and binds
// it to the slot's decode pages.
func (p *restartPair) openBound(room uint64, slot int) {
	p.t.Helper()
	fillRoom(p.src, room, slotOf(slot), int64(slot))
	fillPagesWith(p.dst, slotOf(slot), int64(slot), decodeUnwrote)
	p.open(p.ctx, room)
	if _, err := p.decode.SendMetadata(p.ctx, &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: slotOf(slot)}, AuxIndex: uint32(slot)}); err != nil {
		p.t.Fatalf("SendMetadata %d: %v", room, err)
	}
	p.waitPrefill(room, 20*time.Second, "WaitingForInput", isState(pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT))
}

func (p *restartPair) send(room uint64, slot, from, n int, last bool) error {
	req := &pb.SendRequest{RoomId: room, StartPosition: uint32(from), Pages: &pb.PageList{Indices: slotOf(slot)[from : from+n]}, Last: last}
	if last {
		req.AuxIndex = uint32(slot)
	}
	_, err := p.prefill.Send(p.ctx, req)
	return err
}

// moveRoom runs a whole room in slot and checks its bytes landed.
func (p *restartPair) moveRoom(room uint64, slot int) {
	p.t.Helper()
	p.openBound(room, slot)
	if err := p.send(room, slot, 0, slotPages, true); err != nil {
		p.t.Fatalf("Send %d: %v", room, err)
	}
	p.waitDecode(room, 20*time.Second, "Success", isState(pb.RoomState_ROOM_STATE_SUCCESS))
	p.waitPrefill(room, 20*time.Second, "Success", isState(pb.RoomState_ROOM_STATE_SUCCESS))
	if !roomLanded(p.dst, room, slotOf(slot), int64(slot)) {
		p.t.Fatalf("room %d: decode's pages differ from the source after Success", room)
	}
}

// waitReplaced waits for room to end as a replacement on side does and
// fails the test if either side ever shows Success; it returns decode's
// pages as they were when the failure was visible.
func (p *restartPair) waitReplaced(side string, room uint64, slot int) []byte {
	p.t.Helper()
	var snap []byte
	var ps, ds *pb.RoomStatus
	_, ok := testbed.Eventually(20*time.Second, func() bool {
		var err error
		if ps, err = p.prefillStatus(room); err != nil {
			return false
		}
		if ds, err = p.decodeStatus(room); err != nil {
			return false
		}
		if ps.GetState() == pb.RoomState_ROOM_STATE_SUCCESS || ds.GetState() == pb.RoomState_ROOM_STATE_SUCCESS {
			p.t.Fatalf("room %d reached Success with its region gone: prefill %v, decode %v", room, ps, ds)
		}
		if snap == nil && ds.GetState() == pb.RoomState_ROOM_STATE_FAILED {
			snap = snapshotPages(p.dst, slotOf(slot), int64(slot))
		}
		return replacedOutcome(side, ps, ds)
	})
	if !ok {
		p.t.Fatalf("room %d did not fail region_replaced on %s: prefill %v, decode %v", room, side, ps, ds)
	}
	return snap
}

func (p *restartPair) regionOf(side string) (path string, r *transfer.Region) {
	if side == "prefill" {
		return p.srcPath, p.src
	}
	return p.dstPath, p.dst
}

func (p *restartPair) setRegion(side string, r *transfer.Region) {
	if side == "prefill" {
		p.src = r
	} else {
		p.dst = r
	}
}

// The engine recreated its region file and has not called RegisterRegion
// yet: the daemon notices at the next room's bind (decode SendMetadata)
// or Send (prefill), refuses it FailedPrecondition and fails the room with
// region_replaced instead of touching the dead inode; the peer sees
// aborted:remote. Registering then is generation 2, and rooms succeed with
// their bytes in the new file.
func TestEngineRecreatesItsFileWithoutRegisteringFailsTheNextRoom(t *testing.T) {
	onEachTransport(t, recreatedFileWithoutRegisterFailsTheNextRoom)
}

func recreatedFileWithoutRegisterFailsTheNextRoom(t *testing.T, kind transfer.Kind) {
	for _, side := range []string{"prefill", "decode"} {
		t.Run(side, func(t *testing.T) {
			p := newRestartPair(t, kind)
			p.moveRoom(1, 0)
			before := replacedCounters(t, p.ownerPair)
			path, old := p.regionOf(side)
			deadDecode := p.dst
			p.setRegion(side, recreateRegionFile(t, path, streamLayout))

			const room, slot = 2, 3
			if side == "prefill" {
				p.openBound(room, slot)
				fillRoom(p.src, room, slotOf(slot), slot) // the restarted engine's KV, never to be sent for this room
				if err := p.send(room, slot, 0, slotPages, true); status.Code(err) != codes.FailedPrecondition {
					t.Fatalf("Send with the region file replaced: %v, want FailedPrecondition", err)
				}
			} else {
				fillRoom(p.src, room, slotOf(slot), slot)
				fillPagesWith(p.dst, slotOf(slot), slot, decodeUnwrote)
				fillPagesWith(deadDecode, slotOf(slot), slot, decodeUnwrote)
				p.open(p.ctx, room)
				_, err := p.decode.SendMetadata(p.ctx, &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: slotOf(slot)}, AuxIndex: slot})
				if status.Code(err) != codes.FailedPrecondition {
					t.Fatalf("SendMetadata with the region file replaced: %v, want FailedPrecondition", err)
				}
			}
			p.waitReplaced(side, room, slot)
			unwrote := bytes.Repeat([]byte{decodeUnwrote}, len(snapshotPages(p.dst, slotOf(slot), slot)))
			for what, r := range map[string]*transfer.Region{"the dead decode inode": deadDecode, "the current decode file": p.dst} {
				if !bytes.Equal(snapshotPages(r, slotOf(slot), slot), unwrote) {
					t.Errorf("room %d wrote into %s", room, what)
				}
			}
			after := replacedCounters(t, p.ownerPair)
			if d := after[side][0] - before[side][0]; d != 1 {
				t.Errorf("pdlink_region_replaced_total on %s moved by %v, want 1", side, d)
			}
			if d := after[side][1] - before[side][1]; d != 1 {
				t.Errorf(`pdlink_room_failures_total{reason="region_replaced"} on %s moved by %v, want 1`, side, d)
			}

			reg := registerOn(p.ctx, t, p.prefill, p.decode, side, path, streamLayout)
			if reg.gen != 2 || reg.inode == old.ID().Ino {
				t.Fatalf("register after the replacement: generation %d inode %d (was %d), want 2 and a new inode", reg.gen, reg.inode, old.ID().Ino)
			}
			p.moveRoom(3, 5)
			p.moveRoom(4, slot)
		})
	}
}

// UnregisterRegion with rooms in flight, on either side: they fail with
// region_replaced (the peer aborted:remote) and their decode pages do not
// change after; a repeat answers unregistered false; until RegisterRegion
// again new rooms are refused FailedPrecondition (decode at OpenReceiver,
// prefill at Send); registering again is generation 2 and rooms succeed.
func TestUnregisterRegionWithRoomsInFlight(t *testing.T) {
	onEachTransport(t, unregisterWithRoomsInFlight)
}

func unregisterWithRoomsInFlight(t *testing.T, kind transfer.Kind) {
	for _, side := range []string{"prefill", "decode"} {
		t.Run(side, func(t *testing.T) {
			p := newRestartPair(t, kind)
			inFlight := map[uint64]int{1: 0, 2: 1} // room -> slot
			for room, slot := range inFlight {
				p.openBound(room, slot)
				if err := p.send(room, slot, 0, chunkPages, false); err != nil {
					t.Fatalf("first chunk of room %d: %v", room, err)
				}
			}
			unregister := func() (bool, uint64, uint32) {
				if side == "prefill" {
					r, err := p.prefill.UnregisterRegion(p.ctx, &pb.PrefillServiceUnregisterRegionRequest{Rank: rankOf(0, 1)})
					if err != nil {
						t.Fatal(err)
					}
					return r.Unregistered, r.Generation, r.RoomsFailed
				}
				r, err := p.decode.UnregisterRegion(p.ctx, &pb.DecodeServiceUnregisterRegionRequest{Rank: rankOf(0, 1)})
				if err != nil {
					t.Fatal(err)
				}
				return r.Unregistered, r.Generation, r.RoomsFailed
			}
			if ok, gen, failed := unregister(); !ok || gen != 1 || failed != uint32(len(inFlight)) {
				t.Fatalf("UnregisterRegion: unregistered %v generation %d rooms_failed %d, want true 1 %d", ok, gen, failed, len(inFlight))
			}
			snaps := map[uint64][]byte{}
			for room, slot := range inFlight {
				snaps[room] = p.waitReplaced(side, room, slot)
				if err := p.send(room, slot, chunkPages, slotPages-chunkPages, true); status.Code(err) != codes.FailedPrecondition {
					t.Fatalf("last Send of room %d after UnregisterRegion: %v, want FailedPrecondition", room, err)
				}
			}
			if ok, _, _ := unregister(); ok {
				t.Fatal("a repeated UnregisterRegion dropped a region again")
			}

			const room, slot = 9, 4
			if _, err := p.prefill.OpenSender(p.ctx, &pb.OpenSenderRequest{RoomId: room}); err != nil {
				t.Fatal(err)
			}
			_, err := p.decode.OpenReceiver(p.ctx, &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: p.bootstrap})
			if side == "decode" {
				if status.Code(err) != codes.FailedPrecondition {
					t.Fatalf("OpenReceiver with no region: %v, want FailedPrecondition", err)
				}
				if _, err := p.prefill.Abort(p.ctx, &pb.PrefillServiceAbortRequest{RoomId: room}); err != nil {
					t.Fatal(err)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if _, err := p.decode.SendMetadata(p.ctx, &pb.SendMetadataRequest{RoomId: room, DstPages: &pb.PageList{Indices: slotOf(slot)}, AuxIndex: slot}); err != nil {
					t.Fatal(err)
				}
				p.waitPrefill(room, 20*time.Second, "WaitingForInput", isState(pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT))
				if err := p.send(room, slot, 0, slotPages, true); status.Code(err) != codes.FailedPrecondition {
					t.Fatalf("Send with no region: %v, want FailedPrecondition", err)
				}
			}

			path, _ := p.regionOf(side)
			if reg := registerOn(p.ctx, t, p.prefill, p.decode, side, path, streamLayout); reg.gen != 2 {
				t.Fatalf("register after UnregisterRegion: generation %d, want 2", reg.gen)
			}
			p.moveRoom(21, 6)
			for room, slot := range inFlight {
				if !bytes.Equal(snapshotPages(p.dst, slotOf(slot), int64(slot)), snaps[room]) {
					t.Errorf("room %d: decode pages changed after its Failed was visible", room)
				}
			}
		})
	}
}

// openReceiver is decode rank's scheduler opening room, fed by the
// prefill ranks the mapping names.
func (s *restartStream) openReceiver(room uint64, rank int) *pb.OpenReceiverRequest {
	return &pb.OpenReceiverRequest{RoomId: room, PrefillBootstrapAddr: s.p.bootstrap, Rank: s.rank("decode", rank),
		ExpectedSenders: s.expectedSenders}
}

// openSender is prefill rank's scheduler opening room.
func (s *restartStream) openSender(room uint64, rank int) *pb.OpenSenderRequest {
	return &pb.OpenSenderRequest{RoomId: room, Rank: s.rank("prefill", rank)}
}

// witness is a room that has data-plane state on every rank but the
// restarted one when the engine restarts: the decode ranks in heldBack
// (the restarted decode rank, or those addressing the restarted prefill
// rank) have not sent their metadata yet, the others have and prefill
// bound it. Such a room is not on the restarted rank, so the restart must
// leave it alone: it goes on over the new file and succeeds.
type witness struct {
	rm       *streamRoom
	heldBack []int
}

// openWitness opens the witness on every rank and binds every decode rank
// but the held-back ones; nil when every decode rank is held back (TP 1).
func (s *restartStream) openWitness(ctx context.Context, side string, restarted int) *witness {
	t := s.t
	t.Helper()
	w := &witness{}
	for d := range s.topo.decodeTP {
		if side == "decode" && d == restarted || side == "prefill" && slices.Contains(s.plan.DecodeRanks[d].Targets, restarted) {
			w.heldBack = append(w.heldBack, d)
		}
	}
	if len(w.heldBack) == s.topo.decodeTP {
		return nil
	}
	preTP, decTP := s.topo.prefillTP, s.topo.decodeTP
	rm := &streamRoom{id: s.nextID.Add(1), preGen: make([]int, preTP), decGen: make([]int, decTP), chunksSent: make([]int, preTP)}
	w.rm = rm
	select {
	case rm.slot = <-s.slots:
	case <-time.After(s.bound):
		t.Fatalf("no free slot for the witness room within %v", s.bound)
	}
	pages, aux := slotOf(rm.slot), int64(rm.slot)
	for rank := range preTP {
		var src *transfer.Region
		rm.preGen[rank], src = s.files["prefill"][rank].current()
		fillRoom(src, rankRoom(rm.id, rank), pages, aux)
	}
	for rank := range decTP {
		var dst *transfer.Region
		rm.decGen[rank], dst = s.files["decode"][rank].current()
		fillPagesWith(dst, pages, aux, decodeUnwrote)
	}
	for rank := range decTP {
		if _, err := s.p.decode.OpenReceiver(ctx, s.openReceiver(rm.id, rank)); err != nil {
			t.Fatalf("witness OpenReceiver rank %d: %v", rank, err)
		}
	}
	for rank := range preTP {
		if _, err := s.p.prefill.OpenSender(ctx, s.openSender(rm.id, rank)); err != nil {
			t.Fatalf("witness OpenSender rank %d: %v", rank, err)
		}
	}
	for d := range decTP {
		if slices.Contains(w.heldBack, d) {
			continue
		}
		if err := s.sendMetadata(ctx, rm, d); err != nil {
			t.Fatalf("witness room %d: SendMetadata rank %d: %v", rm.id, d, err)
		}
	}
	// Prefill shows decode's nonce once a METADATA is bound: then the
	// witness holds state on ranks other than the restarted one.
	var ps *pb.RoomStatus
	if _, ok := testbed.Eventually(s.bound, func() bool {
		ps, _, _ = s.poll(ctx, rm.id)
		return ps.GetNonce() != 0 || terminal(ps)
	}); !ok || terminal(ps) {
		t.Fatalf("witness room %d: prefill never bound the first decode ranks' metadata: %v", rm.id, ps)
	}
	return w
}

func (s *restartStream) sendMetadata(ctx context.Context, rm *streamRoom, rank int) error {
	_, err := s.p.decode.SendMetadata(ctx, &pb.SendMetadataRequest{RoomId: rm.id, Rank: s.rank("decode", rank),
		DstPages: &pb.PageList{Indices: slotOf(rm.slot)}, AuxIndex: uint32(rm.slot)})
	return err
}

// finishWitness plays the witness on after the restart: the restarted
// engine's rank takes the room over in its new file (prefill: its source
// pages filled there; decode: its pages), the held-back decode ranks send
// their metadata, every prefill rank sends every page. It must succeed on
// both sides with every decode rank's bytes as the mapping says.
func (s *restartStream) finishWitness(ctx context.Context, w *witness, side string, restarted int) {
	t := s.t
	t.Helper()
	rm := w.rm
	pages, aux := slotOf(rm.slot), int64(rm.slot)
	gen, r := s.files[side][restarted].current()
	rm.gens(side)[restarted] = gen
	if side == "prefill" {
		fillRoom(r, rankRoom(rm.id, restarted), pages, aux)
	} else {
		fillPagesWith(r, pages, aux, decodeUnwrote)
	}
	// A refusal is FailedPrecondition when the room failed: its state,
	// checked below, says why.
	var refused error
	for _, d := range w.heldBack {
		if err := s.sendMetadata(ctx, rm, d); err != nil && refused == nil {
			refused = err
		}
	}
	s.waitUntil(ctx, rm, func(ps, _ *pb.RoomStatus) bool {
		return ps.GetState() == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT || terminal(ps)
	})
	for rank := 0; refused == nil && rank < s.topo.prefillTP; rank++ {
		_, refused = s.p.prefill.Send(ctx, &pb.SendRequest{RoomId: rm.id, Rank: s.rank("prefill", rank), Pages: &pb.PageList{Indices: pages},
			Last: true, AuxIndex: uint32(aux)})
	}
	if refused != nil && status.Code(refused) != codes.FailedPrecondition {
		t.Errorf("witness room %d: %v", rm.id, refused)
	}
	s.waitUntil(ctx, rm, func(ps, ds *pb.RoomStatus) bool { return terminal(ps) && terminal(ds) })
	ps, ds := rm.final[0], rm.final[1]
	if rm.problem != "" || ps.GetState() != pb.RoomState_ROOM_STATE_SUCCESS || ds.GetState() != pb.RoomState_ROOM_STATE_SUCCESS {
		t.Errorf("room %d held no state on the restarted %s rank %d at the restart and ended prefill %v, decode %v (%s); want Success",
			rm.id, side, restarted, ps, ds, rm.problem)
		return
	}
	for d := range s.topo.decodeTP {
		if !s.rankLanded(rm, d) {
			t.Errorf("witness room %d: decode rank %d's bytes differ from the sources the mapping names", rm.id, d)
		}
	}
	_, _ = s.p.prefill.Clear(ctx, &pb.PrefillServiceClearRequest{RoomIds: []uint64{rm.id}})
	_, _ = s.p.decode.Clear(ctx, &pb.DecodeServiceClearRequest{RoomIds: []uint64{rm.id}})
}
