package sim

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/rankmap"
)

type fault int

const (
	faultNone fault = iota
	faultAbortPrefill
	faultAbortDecode
	faultStallDecode
	faultStallPrefill
)

var faultNames = map[fault]string{
	faultAbortPrefill: "abort_prefill", faultAbortDecode: "abort_decode",
	faultStallDecode: "stall_decode_scheduler", faultStallPrefill: "stall_prefill_scheduler",
}

// Stage is the moment a scheduler aborts a room.
type Stage int

// Abort moments, in the order of a room's life.
const (
	// StageBeforeAnyOpen: the scheduler aborts a room it has not opened
	// yet, on either side, then goes on as if nothing happened.
	StageBeforeAnyOpen Stage = iota
	// StageBeforePeerOpen: the aborting side opens first and aborts before
	// the other side opened (R4: the abort reaches a room not yet open).
	StageBeforePeerOpen
	StageAfterOpen
	StageAfterMetadata
	StageMidSend
	// StageAfterSuccess: after both sides ended (usually Success).
	StageAfterSuccess
	numStages
)

var stageNames = [numStages]string{"before_any_open", "before_peer_open", "after_open", "after_metadata", "mid_send", "after_end"}

func (s Stage) String() string {
	if s >= 0 && s < numStages {
		return stageNames[s]
	}
	return "stage?"
}

const auxBuffer = 1000 // buffer id used for the aux row's pattern

type request struct {
	room      uint64
	tag       uint64 // seeds the page pattern: unique per request, even when room ids repeat
	tokens    int
	pages     int
	fault     fault
	stage     Stage
	prefFirst bool
	// dup: second request of a pair sharing a room id.
	dup bool
	// afterFault: the previous request with this room id had a fault.
	afterFault bool
	// opened is closed once this request tried its opens; waitFor is
	// waited for (bounded) right after them (ordered pairs).
	opened  chan struct{}
	waitFor chan struct{}
}

func (s *run) newRequest(room uint64, rng *rand.Rand) request {
	tokens := s.cfg.MinTokens + rng.IntN(s.cfg.MaxTokens-s.cfg.MinTokens+1)
	rq := request{room: room, tag: rng.Uint64() | 1, tokens: tokens, pages: (tokens + s.cfg.Layout.PageTokens - 1) / s.cfg.Layout.PageTokens,
		stage: Stage(rng.IntN(int(numStages))), prefFirst: rng.IntN(2) == 0}
	f := s.cfg.Faults
	if len(f.AbortStages) > 0 {
		rq.stage = f.AbortStages[rng.IntN(len(f.AbortStages))]
	}
	switch x := rng.Float64(); {
	case x < f.AbortPrefill:
		rq.fault = faultAbortPrefill
	case x < f.AbortPrefill+f.AbortDecode:
		rq.fault = faultAbortDecode
	case x < f.AbortPrefill+f.AbortDecode+f.StallDecode:
		rq.fault = faultStallDecode
	case x < f.AbortPrefill+f.AbortDecode+f.StallDecode+f.StallPrefill:
		rq.fault = faultStallPrefill
	}
	if rq.stage == StageBeforePeerOpen {
		// The aborting side opens first.
		rq.prefFirst = rq.fault == faultAbortPrefill || (rq.fault != faultAbortDecode && rq.prefFirst)
	}
	return rq
}

func short(s pb.RoomState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "ROOM_STATE_"))
}

func outcome(st *pb.RoomStatus) string {
	if st.GetState() == pb.RoomState_ROOM_STATE_FAILED {
		return st.GetReason()
	}
	return short(st.GetState())
}

func terminal(s pb.RoomState) bool {
	return s == pb.RoomState_ROOM_STATE_SUCCESS || s == pb.RoomState_ROOM_STATE_FAILED
}

func (s *run) call(ctx context.Context, f func(ctx context.Context) error) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return f(cctx)
}

// serve runs one request through both schedulers.
func (s *run) serve(ctx context.Context, rq request) {
	var opened, waited bool
	signal := func() {
		if !opened && rq.opened != nil {
			close(rq.opened)
		}
		opened = true
	}
	wait := func() {
		if !waited && rq.waitFor != nil {
			select {
			case <-rq.waitFor:
			case <-time.After(30 * time.Second):
			case <-ctx.Done():
			}
		}
		waited = true
	}
	defer signal()
	if rq.dup {
		wait() // the second of an ordered pair opens once the first did
	}
	h, ok := s.allocate(rq)
	if !ok {
		return
	}
	// Decode pages go back to the engines only after the room is over and
	// checked (a freed page could be reused while a write still lands).
	defer h.release(s.Sim)
	fname := faultNames[rq.fault]
	if rq.fault == faultAbortPrefill || rq.fault == faultAbortDecode {
		fname += "@" + rq.stage.String()
	}
	if rq.fault != faultNone {
		s.record(func(r *Report) { r.Faults[fname]++ })
	}

	prefix := int(float64(rq.pages) * s.cfg.PrefixFraction) // positions decode holds
	for _, e := range s.dec {
		for b := range e.tl.Buffers {
			for pos, p := range h.dst[e.rank] {
				if !s.cfg.NoVerify && (s.strict || pos < prefix) {
					fillSentinel(e.region.Pages(b, runOf(p)))
				}
			}
		}
		if s.strict {
			fillSentinel(e.region.AuxRow(int64(h.dstAux[e.rank])))
		}
	}

	start := time.Now()
	var nonce uint64 // decode's, once it opened
	var prefOpen, decOpen bool
	// Each rank's scheduler opens the room with its rank: the first Open
	// creates it, the others join it.
	openPrefill := func() error {
		for _, e := range s.pre {
			req := &pb.OpenSenderRequest{RoomId: rq.room, Rank: rankProto(e.rank, len(s.pre))}
			if s.cfg.RelayNonce {
				req.Nonce = nonce
			}
			err := s.call(ctx, func(ctx context.Context) error {
				_, err := s.prefill.OpenSender(ctx, req)
				return err
			})
			s.refused("OpenSender", e.rank, err)
			if err != nil {
				return err
			}
			prefOpen = true
		}
		return nil
	}
	openDecode := func() error {
		for _, e := range s.dec {
			req := &pb.OpenReceiverRequest{RoomId: rq.room, PrefillBootstrapAddr: s.cfg.Bootstrap, ExpectedSenders: s.expectedSenders,
				Rank: rankProto(e.rank, len(s.dec))}
			open := func() error {
				return s.call(ctx, func(ctx context.Context) error {
					resp, err := s.decode.OpenReceiver(ctx, req)
					if err != nil {
						return err
					}
					if n := resp.GetStatus().GetNonce(); decOpen && n != nonce {
						return status.Errorf(codes.Internal, "sim: decode rank %d joined room %d with nonce %d, rank 0 drew %d", e.rank, rq.room, n, nonce)
					}
					nonce = resp.GetStatus().GetNonce()
					return nil
				})
			}
			err := open()
			if noRegion(err) && s.Register(ctx) == nil {
				err = open()
			}
			s.refused("OpenReceiver", e.rank, err)
			if err != nil {
				return err
			}
			decOpen = true
		}
		return nil
	}
	first, second := openDecode, openPrefill
	if rq.prefFirst {
		first, second = openPrefill, openDecode
	}
	s.maybeAbort(ctx, rq, StageBeforeAnyOpen)
	if err := first(); err != nil {
		signal()
		s.record(func(r *Report) { r.Outcomes["open_error:"+grpcCode(err)]++ })
		if !decOpen {
			s.checkUntouched(h)
		}
		if prefOpen || decOpen { // a rank joining the room was refused: the scheduler gives up on it
			s.abortOpened(ctx, rq.room, prefOpen, decOpen)
			if !s.cfg.NoClear {
				s.clear(ctx, rq.room, prefOpen, decOpen)
			}
		}
		return
	}
	s.maybeAbort(ctx, rq, StageBeforePeerOpen)
	if err := second(); err != nil {
		signal()
		wait()
		// The other side refused (draining, full, gone, the room id is
		// another request's): a real scheduler gives up on the request and
		// releases what it opened, and only that.
		s.record(func(r *Report) { r.Outcomes["open_error:"+grpcCode(err)]++ })
		s.abortOpened(ctx, rq.room, prefOpen, decOpen)
		if !s.cfg.NoClear {
			s.clear(ctx, rq.room, prefOpen, decOpen)
		}
		if !decOpen {
			s.checkUntouched(h)
		}
		return
	}
	signal()
	wait()
	s.maybeAbort(ctx, rq, StageAfterOpen)
	for _, e := range s.dec {
		if rq.fault == faultStallDecode {
			break
		}
		s.refused("SendMetadata", e.rank, s.call(ctx, func(ctx context.Context) error {
			_, err := s.decode.SendMetadata(ctx, &pb.SendMetadataRequest{RoomId: rq.room, Rank: rankProto(e.rank, len(s.dec)),
				DstPages: &pb.PageList{Indices: h.dst[e.rank]}, AuxIndex: uint32(h.dstAux[e.rank]), PrefixLen: uint32(prefix)})
			return err
		}))
	}
	s.maybeAbort(ctx, rq, StageAfterMetadata)

	var ps, ds *pb.RoomStatus
	sent := false
	var handed sends
	var decodeDone time.Time
	tick := time.NewTicker(s.cfg.Tick)
	defer tick.Stop()
	for {
		// A scheduler stops polling a room once it saw it end.
		if !terminal(ps.GetState()) {
			ps = s.pollPrefill(ctx, rq.room)
		}
		if !terminal(ds.GetState()) {
			ds = s.pollDecode(ctx, rq.room)
		}
		if decodeDone.IsZero() && terminal(ds.GetState()) {
			decodeDone = time.Now()
		}
		if !sent && ps.GetState() == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT {
			sent = true
			// Prefill learns decode's prefix from its own room, as SGLang's
			// prefill does at bootstrap, and stages and sends only what
			// follows it; the sim's own prefix is decode's knowledge.
			from := min(int(ps.GetPrefixLen()), rq.pages)
			s.stage(rq, h, from)
			handed = s.sendChunks(ctx, rq, h.src, h.srcAux, from)
		}
		if terminal(ps.GetState()) && terminal(ds.GetState()) {
			break
		}
		if time.Since(start) > s.cfg.PinBound || ctx.Err() != nil {
			if ctx.Err() == nil {
				s.record(func(r *Report) { r.Pinned++ })
			}
			break
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
	}
	took := time.Since(start)
	s.maybeAbort(ctx, rq, StageAfterSuccess)
	s.record(func(r *Report) {
		r.Outcomes["prefill:"+outcome(ps)]++
		r.Outcomes["decode:"+outcome(ds)]++
		r.WorstTerminal = max(r.WorstTerminal, took)
		if rq.fault != faultNone {
			r.FaultOutcomes[fname+" -> prefill:"+outcome(ps)]++
			r.FaultOutcomes[fname+" -> decode:"+outcome(ds)]++
		}
		if rq.fault == faultNone {
			for side, st := range map[string]*pb.RoomStatus{"prefill": ps, "decode": ds} {
				if st.GetState() != pb.RoomState_ROOM_STATE_SUCCESS {
					r.CleanFailed[side+":"+outcome(st)]++
				}
			}
		}
	})

	switch ds.GetState() {
	case pb.RoomState_ROOM_STATE_SUCCESS:
		bad := s.verify(h, prefix) // decode ranks whose pages are wrong
		s.record(func(r *Report) {
			if !s.cfg.NoVerify {
				r.Verified++
			}
			if len(bad) > 0 {
				r.Corrupt++
				for _, d := range bad {
					r.DecodeRanks[d].Corrupt++
				}
			} else {
				s.count(r, rq.pages, prefix, handed)
			}
			if !handed.last.IsZero() && decodeDone.After(handed.last) {
				r.LastChunkToSuccess = append(r.LastChunkToSuccess, decodeDone.Sub(handed.last))
				r.FirstSendToSuccess = append(r.FirstSendToSuccess, decodeDone.Sub(handed.first))
			}
		})
	case pb.RoomState_ROOM_STATE_FAILED:
		// Failed is visible only once the receiver is fenced (I9): from
		// now on not one byte may land in these pages (R7).
		if s.strict {
			s.fillDst(h)
			time.Sleep(20 * time.Millisecond)
			if !s.untouched(h) {
				s.record(func(r *Report) { r.LateWrites++ })
			}
		}
	}
	if !s.cfg.NoClear {
		s.clear(ctx, rq.room, true, true)
	}
}

func (s *run) fillDst(h *held) {
	for _, e := range s.dec {
		for b := range e.tl.Buffers {
			for _, p := range h.dst[e.rank] {
				fillSentinel(e.region.Pages(b, runOf(p)))
			}
		}
		fillSentinel(e.region.AuxRow(int64(h.dstAux[e.rank])))
	}
}

func (s *run) untouched(h *held) bool {
	for _, e := range s.dec {
		for b := range e.tl.Buffers {
			for _, p := range h.dst[e.rank] {
				if !isSentinel(e.region.Pages(b, runOf(p))) {
					return false
				}
			}
		}
		if !isSentinel(e.region.AuxRow(int64(h.dstAux[e.rank]))) {
			return false
		}
	}
	return true
}

// checkUntouched counts a request whose decode room never opened but
// whose pages changed: another request's bytes landed there.
func (s *run) checkUntouched(h *held) {
	if !s.strict {
		return
	}
	time.Sleep(20 * time.Millisecond)
	if !s.untouched(h) {
		s.record(func(r *Report) { r.Crossed++ })
	}
}

func (s *run) abortOpened(ctx context.Context, room uint64, prefill, decode bool) {
	if prefill {
		_ = s.call(ctx, func(ctx context.Context) error {
			_, err := s.prefill.Abort(ctx, &pb.PrefillServiceAbortRequest{RoomId: room, Reason: "sim: open failed"})
			return err
		})
	}
	if decode {
		_ = s.call(ctx, func(ctx context.Context) error {
			_, err := s.decode.Abort(ctx, &pb.DecodeServiceAbortRequest{RoomId: room, Reason: "sim: open failed"})
			return err
		})
	}
}

// clear clears the room on the sides this request opened, waiting
// (bounded) for a room that is failing to become visibly terminal first.
func (s *run) clear(ctx context.Context, room uint64, prefill, decode bool) {
	deadline := time.Now().Add(5 * time.Second)
	for prefill || decode {
		if prefill {
			_ = s.call(ctx, func(ctx context.Context) error {
				resp, err := s.prefill.Clear(ctx, &pb.PrefillServiceClearRequest{RoomIds: []uint64{room}})
				prefill = err == nil && resp.Results[0].Error == "NOT_TERMINAL"
				return err
			})
		}
		if decode {
			_ = s.call(ctx, func(ctx context.Context) error {
				resp, err := s.decode.Clear(ctx, &pb.DecodeServiceClearRequest{RoomIds: []uint64{room}})
				decode = err == nil && resp.Results[0].Error == "NOT_TERMINAL"
				return err
			})
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		if prefill || decode {
			time.Sleep(s.cfg.Tick)
		}
	}
}

func (s *run) maybeAbort(ctx context.Context, rq request, stage Stage) {
	if rq.stage != stage {
		return
	}
	switch rq.fault {
	case faultAbortPrefill:
		_ = s.call(ctx, func(ctx context.Context) error {
			_, err := s.prefill.Abort(ctx, &pb.PrefillServiceAbortRequest{RoomId: rq.room, Reason: "sim"})
			return err
		})
	case faultAbortDecode:
		_ = s.call(ctx, func(ctx context.Context) error {
			_, err := s.decode.Abort(ctx, &pb.DecodeServiceAbortRequest{RoomId: rq.room, Reason: "sim"})
			return err
		})
	}
}

// stage writes what the prefill engine computed into the source pages
// the scheduler will hand over: each rank's pages from position from on
// (decode holds the rest, so a real engine copies nothing of them out of
// the GPU) and its aux row.
func (s *run) stage(rq request, h *held, from int) {
	if s.cfg.NoVerify {
		return
	}
	for _, e := range s.pre {
		tag := rankTag(rq.tag, e.rank)
		for b := range e.tl.Buffers {
			for pos := from; pos < len(h.src[e.rank]); pos++ {
				fillPage(e.region.Pages(b, runOf(h.src[e.rank][pos])), tag, b, pos)
			}
		}
		fillPage(e.region.AuxRow(int64(h.srcAux[e.rank])), tag, auxBuffer, 0)
	}
}

// sends is what a room's prefill schedulers handed over: when the first
// Send was issued and the last one returned (zero when some rank did not
// get that far), and per prefill rank the page positions its Sends handed
// over (a position sent layer by layer is one position: its groups name
// every buffer once).
type sends struct {
	first, last time.Time
	pages       []int64 // by prefill rank; each rank's goroutine writes only its own entry
}

// segment is one Send's share of a chunk: positions [start, end) of the
// chunk of chunked prefill numbered chunk.
type segment struct{ chunk, start, end int }

// segments cuts a room of pages positions into its Sends: one per chunk,
// starting at from (decode's prefix: the chunks it covers send nothing).
// A room decode holds whole is one last Send of no pages at the end, which
// carries the aux row once the last chunk was computed.
func (s *run) segments(pages, from int) []segment {
	var out []segment
	for i, pos := 0, 0; pos < pages; i, pos = i+1, pos+s.cfg.ChunkPages {
		if end := min(pos+s.cfg.ChunkPages, pages); end > from {
			out = append(out, segment{i, max(pos, from), end})
		}
	}
	if len(out) == 0 {
		out = []segment{{(pages - 1) / s.cfg.ChunkPages, pages, pages}}
	}
	return out
}

// sendChunks hands the room's pages from position from on over in chunks,
// each once its forward pass of chunked prefill finished (every chunk is
// computed: decode's prefix saves the transfer, not the prefill), every
// prefill rank its own pages at once (the ranks run the same forward
// passes in lockstep, each Sends from its own process).
func (s *run) sendChunks(ctx context.Context, rq request, src [][]int32, srcAux []int32, from int) sends {
	var chunks []int
	for pos := 0; pos < rq.pages; pos += s.cfg.ChunkPages {
		chunks = append(chunks, s.chunkTokens(rq, pos, min(pos+s.cfg.ChunkPages, rq.pages)))
	}
	computed := s.gpu.book(chunks)
	segs := s.segments(rq.pages, from)
	out := sends{pages: make([]int64, len(src))}
	firsts, lasts := make([]time.Time, len(src)), make([]time.Time, len(src))
	if len(src) == 1 {
		firsts[0], lasts[0] = s.sendRank(ctx, rq, 0, 1, chunks, computed, segs, src[0], srcAux[0], &out)
	} else {
		var wg sync.WaitGroup
		for rank := range src {
			wg.Add(1)
			go func() {
				defer wg.Done()
				firsts[rank], lasts[rank] = s.sendRank(ctx, rq, rank, len(src), chunks, computed, segs, src[rank], srcAux[rank], &out)
			}()
		}
		wg.Wait()
	}
	for rank := range src {
		if firsts[rank].IsZero() || lasts[rank].IsZero() {
			out.first, out.last = time.Time{}, time.Time{}
			return out
		}
		if out.first.IsZero() || firsts[rank].Before(out.first) {
			out.first = firsts[rank]
		}
		if lasts[rank].After(out.last) {
			out.last = lasts[rank]
		}
	}
	return out
}

// sendRank is one prefill rank's scheduler sending its pages (src) segment
// by segment, each once its chunk is computed, and adding what each Send
// handed over to its rank's entries of handed. Rank 0 alone plays the
// request's abort.
func (s *run) sendRank(ctx context.Context, rq request, rank, size int, chunks []int, computed []time.Time, segs []segment, src []int32, auxRow int32, handed *sends) (first, lastReturned time.Time) {
	groups := s.sendGroups()
	// ran waits until group g of chunk i is computed: its layers' share of
	// the chunk's forward pass (the whole pass when one Send is for all).
	ran := func(i, g int) bool {
		if computed == nil {
			return true
		}
		pass := s.gpu.passTime(chunks[i])
		return s.gpu.computed(ctx, computed[i].Add(-pass+pass*time.Duration(g+1)/time.Duration(len(groups)))) == nil
	}
	lag := func() bool {
		if s.cfg.SendDelay == nil {
			return true
		}
		return realClock{}.SleepUntil(ctx, time.Now().Add(s.cfg.SendDelay(rank))) == nil
	}
	abort := func(stage Stage) {
		if rank == 0 {
			s.maybeAbort(ctx, rq, stage)
		}
	}
	r := rankProto(rank, size)
	for j, seg := range segs {
		last := seg.end == len(src)
		if !ran(seg.chunk, 0) {
			return time.Time{}, time.Time{}
		}
		if first.IsZero() {
			first = time.Now()
		}
		if last && rq.fault == faultStallPrefill {
			if j == 0 && seg.start < seg.end {
				// Hand over one page so the room is Transferring on
				// prefill, then never the rest.
				_ = s.call(ctx, func(ctx context.Context) error {
					_, err := s.prefill.Send(ctx, &pb.SendRequest{RoomId: rq.room, Rank: r, StartPosition: uint32(seg.start),
						Pages: &pb.PageList{Indices: src[seg.start : seg.start+1]}})
					return err
				})
			}
			return time.Time{}, time.Time{}
		}
		if rq.stage == StageMidSend && j > 0 {
			abort(StageMidSend)
		}
		for g, named := range groups {
			if g > 0 && !ran(seg.chunk, g) || !lag() {
				return time.Time{}, time.Time{}
			}
			pages := src[seg.start:seg.end]
			err := s.call(ctx, func(ctx context.Context) error {
				_, err := s.prefill.Send(ctx, &pb.SendRequest{RoomId: rq.room, Rank: r, StartPosition: uint32(seg.start), Buffers: named,
					Pages: &pb.PageList{Indices: pages}, Last: last && g == len(groups)-1, AuxIndex: uint32(auxRow)})
				return err
			})
			if err != nil {
				s.refused("Send", rank, err)
				return time.Time{}, time.Time{}
			}
			if g == 0 {
				handed.pages[rank] += int64(len(pages))
			}
		}
	}
	if rq.stage == StageMidSend && len(segs) == 1 {
		abort(StageMidSend)
	}
	return first, time.Now()
}

// sendGroups is the buffers of each Send of a chunk: one Send for all
// (nil), or with LayerWise one per layer naming its K and V buffers.
func (s *run) sendGroups() [][]uint32 {
	if !s.cfg.LayerWise {
		return [][]uint32{nil}
	}
	var groups [][]uint32
	for b := 0; b+1 < 2*s.cfg.Layout.Layers; b += 2 {
		groups = append(groups, []uint32{uint32(b), uint32(b + 1)})
	}
	return groups
}

// chunkTokens is how many of the request's tokens the pages [pos, end)
// hold: a whole page each, but the last page holds what is left.
func (s *run) chunkTokens(rq request, pos, end int) int {
	pt := s.cfg.Layout.PageTokens
	return min(end*pt, rq.tokens) - pos*pt
}

// lost is what a scheduler sees of a room its daemon no longer knows
// (the daemon restarted and lost its table): the room is over.
func lost() *pb.RoomStatus {
	return &pb.RoomStatus{Found: false, State: pb.RoomState_ROOM_STATE_FAILED, Reason: "not_found"}
}

func (s *run) pollPrefill(ctx context.Context, room uint64) *pb.RoomStatus {
	return s.poll(ctx, func(ctx context.Context) ([]*pb.RoomStatus, error) {
		resp, err := s.prefill.Poll(ctx, &pb.PrefillServicePollRequest{RoomIds: []uint64{room}})
		return resp.GetStatuses(), err
	})
}

func (s *run) pollDecode(ctx context.Context, room uint64) *pb.RoomStatus {
	return s.poll(ctx, func(ctx context.Context) ([]*pb.RoomStatus, error) {
		resp, err := s.decode.Poll(ctx, &pb.DecodeServicePollRequest{RoomIds: []uint64{room}})
		return resp.GetStatuses(), err
	})
}

// poll asks one daemon for one room. A daemon that is gone (stopped or
// killed) ends the room for this scheduler, the way an engine sees its
// daemon's socket close; a room the daemon no longer holds is "not_found".
func (s *run) poll(ctx context.Context, call func(context.Context) ([]*pb.RoomStatus, error)) *pb.RoomStatus {
	var st *pb.RoomStatus
	err := s.call(ctx, func(ctx context.Context) error {
		sts, err := call(ctx)
		if err == nil {
			st = sts[0]
		}
		return err
	})
	if status.Code(err) == codes.Unavailable && ctx.Err() == nil {
		return unreachable(err)
	}
	if st != nil && !st.Found {
		return lost()
	}
	return st
}

// verify checks every decode rank's destination against the prefill
// ranks the mapping feeds it from: the prefix positions still hold the
// sentinel (no byte moved for them), every other page holds exactly what
// its copies take from the source ranks' pages at the same position, and
// the aux row is AuxFrom's. It returns the decode ranks that differ (none
// with NoVerify: nobody filled the sources).
func (s *run) verify(h *held, prefix int) (bad []int) {
	if s.cfg.NoVerify {
		return nil
	}
	for _, e := range s.dec {
		if !s.verifyRank(h, e, prefix) {
			bad = append(bad, e.rank)
		}
	}
	return bad
}

func (s *run) verifyRank(h *held, e *engine, prefix int) bool {
	dr := s.plan.DecodeRanks[e.rank]
	for b := range e.tl.Buffers {
		for pos, p := range h.dst[e.rank] {
			page := e.region.Pages(b, runOf(p))
			if pos < prefix {
				if !isSentinel(page) {
					return false
				}
				continue
			}
			if !PageLanded(dr, b, page, func(from int) []byte { return s.pre[from].region.Pages(b, runOf(h.src[from][pos])) }) {
				return false
			}
		}
	}
	src := s.pre[dr.AuxFrom].region.AuxRow(int64(h.srcAux[dr.AuxFrom]))
	return bytes.Equal(e.region.AuxRow(int64(h.dstAux[e.rank])), src)
}

// PageLanded reports whether page, one page of buffer buf on decode rank dr, holds exactly
// what dr's copies of that buffer take from their prefill ranks' pages at the same position
// (source(from) is prefill rank from's page): every byte of it written by some copy, each
// from the right rank's right head slice. Pure, so the e2e suites check real daemons'
// pages with the same logic the simulated schedulers use.
func PageLanded(dr rankmap.DecodeRank, buf int, page []byte, source func(from int) []byte) bool {
	var copies []rankmap.Copy
	for _, c := range dr.Copies {
		if c.Buffer == buf {
			copies = append(copies, c)
		}
	}
	if len(copies) == 1 && copies[0].Whole() {
		return bytes.Equal(page, source(copies[0].From))
	}
	// A page assembled from slices is compared after applying them onto a copy of itself,
	// so the copies must also cover it: a byte no copy writes would pass unchecked.
	want := append([]byte(nil), page...)
	covered := 0
	for _, c := range copies {
		c.Apply(want, source(c.From))
		covered += c.Heads * c.HeadBytes * c.PageTokens
	}
	return covered == len(page) && bytes.Equal(page, want)
}

// count adds a verified room of pages positions, prefix of them decode's
// already, to the report: what landed on each decode rank, what each
// prefill rank's copies sent (from the mapping), and what each prefill
// rank's scheduler handed over in its Sends.
func (s *run) count(r *Report, pages, prefix int, handed sends) {
	moved := int64(pages - prefix)
	fed := map[int]bool{}
	for _, e := range s.dec {
		var landed int64
		for _, c := range s.plan.DecodeRanks[e.rank].Copies {
			n := moved * int64(c.Heads*c.HeadBytes*c.PageTokens)
			landed += n
			r.PrefillRanks[c.From].Bytes += n
			fed[c.From] = true
		}
		r.DecodeRanks[e.rank].Rooms++
		r.DecodeRanks[e.rank].Bytes += landed
		r.DecodeRanks[e.rank].Pages += moved
		r.Bytes += landed
		r.LandedPages += moved
		r.PrefixPages += int64(prefix)
	}
	for from := range fed {
		r.PrefillRanks[from].Rooms++
	}
	for rank := range handed.pages {
		r.PrefillRanks[rank].Pages += handed.pages[rank]
		r.SentPages += handed.pages[rank]
		var position int64 // a position's bytes: its page of every buffer
		for _, b := range s.pre[rank].tl.Buffers {
			position += b.ItemLen
		}
		r.SentBytes += handed.pages[rank] * position
	}
}

// rankTag is the page pattern's seed for one prefill rank's copy of a
// request: the request's tag on rank 0, another on each other rank, so a
// page from the wrong rank never matches.
func rankTag(tag uint64, rank int) uint64 { return tag ^ uint64(rank)*0xD1B54A32D192ED03 }

// held is what one request holds of every rank's engine, by rank.
type held struct {
	src, dst       [][]int32
	srcAux, dstAux []int32
}

// allocate takes the request's pages and aux rows on every rank, in one
// order for every request (prefill pages, decode pages, prefill aux,
// decode aux, each by rank) so that requests waiting for each other's
// pages cannot deadlock. It gives up, releasing all, once the run stops.
func (s *run) allocate(rq request) (*held, bool) {
	h := &held{}
	take := func(engines []*engine, n int, pool func(*engine) *allocator) ([][]int32, bool) {
		var out [][]int32
		for _, e := range engines {
			p, ok := pool(e).alloc(n, s.stop)
			if !ok {
				return out, false
			}
			out = append(out, p)
		}
		return out, true
	}
	pages := func(e *engine) *allocator { return e.pages }
	aux := func(e *engine) *allocator { return e.aux }
	var srcAux, dstAux [][]int32
	ok := false
	if h.src, ok = take(s.pre, rq.pages, pages); ok {
		if h.dst, ok = take(s.dec, rq.pages, pages); ok {
			if srcAux, ok = take(s.pre, 1, aux); ok {
				dstAux, ok = take(s.dec, 1, aux)
			}
		}
	}
	for _, a := range srcAux {
		h.srcAux = append(h.srcAux, a[0])
	}
	for _, a := range dstAux {
		h.dstAux = append(h.dstAux, a[0])
	}
	if !ok {
		h.release(s.Sim)
		return nil, false
	}
	return h, true
}

// release gives back whatever the request holds.
func (h *held) release(s *Sim) {
	for i, p := range h.src {
		s.pre[i].pages.release(p)
	}
	for i, p := range h.dst {
		s.dec[i].pages.release(p)
	}
	for i, a := range h.srcAux {
		s.pre[i].aux.release([]int32{a})
	}
	for i, a := range h.dstAux {
		s.dec[i].aux.release([]int32{a})
	}
}
