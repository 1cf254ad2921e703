package sim

import (
	"context"
	"math/rand/v2"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/pdlink/pdlink/api/pdlink/v1"
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
	src, ok := s.pre.pages.alloc(rq.pages, s.stop)
	if !ok {
		return
	}
	defer s.pre.pages.release(src)
	dst, ok := s.dec.pages.alloc(rq.pages, s.stop)
	if !ok {
		return
	}
	srcAux, ok := s.pre.aux.alloc(1, s.stop)
	if !ok {
		s.dec.pages.release(dst)
		return
	}
	defer s.pre.aux.release(srcAux)
	dstAux, ok := s.dec.aux.alloc(1, s.stop)
	if !ok {
		s.dec.pages.release(dst)
		return
	}
	// Decode pages go back to the engine only after the room is over and
	// checked (a freed page could be reused while a write still lands).
	defer s.dec.aux.release(dstAux)
	defer s.dec.pages.release(dst)
	fname := faultNames[rq.fault]
	if rq.fault == faultAbortPrefill || rq.fault == faultAbortDecode {
		fname += "@" + rq.stage.String()
	}
	if rq.fault != faultNone {
		s.record(func(r *Report) { r.Faults[fname]++ })
	}

	nbuf := len(s.tl.Buffers)
	prefix := int(float64(len(dst)) * s.cfg.PrefixFraction) // positions decode holds
	for b := 0; b < nbuf && !s.cfg.NoVerify; b++ {
		for pos, p := range src {
			fillPage(s.pre.region.Pages(b, runOf(p)), rq.tag, b, pos)
			if s.strict || pos < prefix {
				fillSentinel(s.dec.region.Pages(b, runOf(dst[pos])))
			}
		}
	}
	if !s.cfg.NoVerify {
		fillPage(s.pre.region.AuxRow(int64(srcAux[0])), rq.tag, auxBuffer, 0)
	}
	if s.strict {
		fillSentinel(s.dec.region.AuxRow(int64(dstAux[0])))
	}

	start := time.Now()
	var nonce uint64 // decode's, once it opened
	var prefOpen, decOpen bool
	openPrefill := func() error {
		req := &pb.OpenSenderRequest{RoomId: rq.room}
		if s.cfg.RelayNonce {
			req.Nonce = nonce
		}
		err := s.call(ctx, func(ctx context.Context) error {
			_, err := s.prefill.OpenSender(ctx, req)
			return err
		})
		prefOpen = err == nil
		return err
	}
	openDecode := func() error {
		err := s.call(ctx, func(ctx context.Context) error {
			resp, err := s.decode.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: rq.room, PrefillBootstrapAddr: s.cfg.Bootstrap})
			if err == nil {
				nonce = resp.GetStatus().GetNonce()
			}
			return err
		})
		if noRegion(err) && s.Register(ctx) == nil {
			err = s.call(ctx, func(ctx context.Context) error {
				resp, err := s.decode.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: rq.room, PrefillBootstrapAddr: s.cfg.Bootstrap})
				if err == nil {
					nonce = resp.GetStatus().GetNonce()
				}
				return err
			})
		}
		decOpen = err == nil
		return err
	}
	first, second := openDecode, openPrefill
	if rq.prefFirst {
		first, second = openPrefill, openDecode
	}
	s.maybeAbort(ctx, rq, StageBeforeAnyOpen)
	if err := first(); err != nil {
		signal()
		s.record(func(r *Report) { r.Outcomes["open_error:"+grpcCode(err)]++ })
		s.checkUntouched(rq, dst, dstAux[0])
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
			s.checkUntouched(rq, dst, dstAux[0])
		}
		return
	}
	signal()
	wait()
	s.maybeAbort(ctx, rq, StageAfterOpen)
	if rq.fault != faultStallDecode {
		pl := &pb.PageList{Indices: dst}
		_ = s.call(ctx, func(ctx context.Context) error {
			_, err := s.decode.SendMetadata(ctx, &pb.SendMetadataRequest{RoomId: rq.room, DstPages: pl, AuxIndex: uint32(dstAux[0]),
				PrefixLen: uint32(prefix)})
			return err
		})
	}
	s.maybeAbort(ctx, rq, StageAfterMetadata)

	var ps, ds *pb.RoomStatus
	sent := false
	var firstSend, lastChunk time.Time
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
			firstSend, lastChunk = s.sendChunks(ctx, rq, src, srcAux[0])
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
		good := s.cfg.NoVerify || s.verify(rq, dst, dstAux[0], prefix)
		bytes := int64(rq.pages-prefix) * int64(nbuf) * s.tl.Buffers[0].ItemLen
		s.record(func(r *Report) {
			if !s.cfg.NoVerify {
				r.Verified++
			}
			if !good {
				r.Corrupt++
			} else {
				r.Bytes += bytes
			}
			if !lastChunk.IsZero() && decodeDone.After(lastChunk) {
				r.LastChunkToSuccess = append(r.LastChunkToSuccess, decodeDone.Sub(lastChunk))
				r.FirstSendToSuccess = append(r.FirstSendToSuccess, decodeDone.Sub(firstSend))
			}
		})
	case pb.RoomState_ROOM_STATE_FAILED:
		// Failed is visible only once the receiver is fenced (I9): from
		// now on not one byte may land in these pages (R7).
		if s.strict {
			s.fillDst(dst, dstAux[0])
			time.Sleep(20 * time.Millisecond)
			if !s.untouched(dst, dstAux[0]) {
				s.record(func(r *Report) { r.LateWrites++ })
			}
		}
	}
	if !s.cfg.NoClear {
		s.clear(ctx, rq.room, true, true)
	}
}

func (s *run) fillDst(dst []int32, aux int32) {
	for b := range s.tl.Buffers {
		for _, p := range dst {
			fillSentinel(s.dec.region.Pages(b, runOf(p)))
		}
	}
	fillSentinel(s.dec.region.AuxRow(int64(aux)))
}

func (s *run) untouched(dst []int32, aux int32) bool {
	for b := range s.tl.Buffers {
		for _, p := range dst {
			if !isSentinel(s.dec.region.Pages(b, runOf(p))) {
				return false
			}
		}
	}
	return isSentinel(s.dec.region.AuxRow(int64(aux)))
}

// checkUntouched counts a request whose decode room never opened but
// whose pages changed: another request's bytes landed there.
func (s *run) checkUntouched(rq request, dst []int32, aux int32) {
	if !s.strict {
		return
	}
	time.Sleep(20 * time.Millisecond)
	if !s.untouched(dst, aux) {
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

// sendChunks hands the room's pages over in chunks, each once its forward
// pass of chunked prefill finished, and returns when the first Send was
// issued and when the last Send returned (zero times when it did not get
// that far).
func (s *run) sendChunks(ctx context.Context, rq request, src []int32, auxRow int32) (first, lastReturned time.Time) {
	var chunks []int
	for pos := 0; pos < len(src); pos += s.cfg.ChunkPages {
		chunks = append(chunks, s.chunkTokens(rq, pos, min(pos+s.cfg.ChunkPages, len(src))))
	}
	computed := s.gpu.book(chunks)
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
	for i, pos := 0, 0; pos < len(src); i, pos = i+1, pos+s.cfg.ChunkPages {
		end := min(pos+s.cfg.ChunkPages, len(src))
		last := end == len(src)
		if !ran(i, 0) {
			return time.Time{}, time.Time{}
		}
		if first.IsZero() {
			first = time.Now()
		}
		if last && rq.fault == faultStallPrefill {
			if pos == 0 {
				// Hand over one page so the room is Transferring on
				// prefill, then never the rest.
				_ = s.call(ctx, func(ctx context.Context) error {
					_, err := s.prefill.Send(ctx, &pb.SendRequest{RoomId: rq.room, StartPosition: 0,
						Pages: &pb.PageList{Indices: src[:1]}})
					return err
				})
			}
			return time.Time{}, time.Time{}
		}
		if rq.stage == StageMidSend && pos > 0 {
			s.maybeAbort(ctx, rq, StageMidSend)
		}
		for g, buffers := range groups {
			if g > 0 && !ran(i, g) {
				return time.Time{}, time.Time{}
			}
			err := s.call(ctx, func(ctx context.Context) error {
				_, err := s.prefill.Send(ctx, &pb.SendRequest{RoomId: rq.room, StartPosition: uint32(pos), Buffers: buffers,
					Pages: &pb.PageList{Indices: src[pos:end]}, Last: last && g == len(groups)-1, AuxIndex: uint32(auxRow)})
				return err
			})
			if err != nil {
				return time.Time{}, time.Time{}
			}
		}
	}
	if rq.stage == StageMidSend && len(src) <= s.cfg.ChunkPages {
		s.maybeAbort(ctx, rq, StageMidSend)
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
	for b := 0; b+1 < len(s.tl.Buffers); b += 2 {
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

// verify checks the room's destination: the prefix positions still hold
// the sentinel (no byte moved for them), every other the source's pattern.
func (s *run) verify(rq request, dst []int32, auxRow int32, prefix int) bool {
	for b := range s.tl.Buffers {
		for pos, p := range dst {
			page := s.dec.region.Pages(b, runOf(p))
			if pos < prefix && !isSentinel(page) || pos >= prefix && !checkPage(page, rq.tag, b, pos) {
				return false
			}
		}
	}
	return checkPage(s.dec.region.AuxRow(int64(auxRow)), rq.tag, auxBuffer, 0)
}
