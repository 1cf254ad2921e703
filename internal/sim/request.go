package sim

import (
	"context"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"math/rand/v2"
	"strings"
	"time"

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

// stages at which an abort is injected.
const (
	stageAfterOpen = iota
	stageAfterMetadata
	stageMidSend
	stageAfterSuccess
	numStages
)

const auxBuffer = 1000 // buffer id used for the aux row's pattern

type request struct {
	room      uint64
	pages     int
	fault     fault
	stage     int
	prefFirst bool
}

func (s *run) newRequest(room uint64, rng *rand.Rand) request {
	tokens := s.cfg.MinTokens + rng.IntN(s.cfg.MaxTokens-s.cfg.MinTokens+1)
	rq := request{room: room, pages: (tokens + s.cfg.Layout.PageTokens - 1) / s.cfg.Layout.PageTokens,
		stage: rng.IntN(numStages), prefFirst: rng.IntN(2) == 0}
	f := s.cfg.Faults
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
	if rq.fault != faultNone {
		s.record(func(r *Report) { r.Faults[faultNames[rq.fault]]++ })
	}

	nbuf := len(s.tl.Buffers)
	for b := 0; b < nbuf && !s.cfg.NoVerify; b++ {
		for pos, p := range src {
			fillPage(s.pre.region.Pages(b, runOf(p)), rq.room, b, pos)
			if s.cfg.Faults.any() {
				fillSentinel(s.dec.region.Pages(b, runOf(dst[pos])))
			}
		}
	}
	fillPage(s.pre.region.AuxRow(int64(srcAux[0])), rq.room, auxBuffer, 0)

	start := time.Now()
	openPrefill := func() error {
		return s.call(ctx, func(ctx context.Context) error {
			_, err := s.prefill.OpenSender(ctx, &pb.OpenSenderRequest{RoomId: rq.room})
			return err
		})
	}
	openDecode := func() error {
		return s.call(ctx, func(ctx context.Context) error {
			_, err := s.decode.OpenReceiver(ctx, &pb.OpenReceiverRequest{RoomId: rq.room, PrefillBootstrapAddr: s.cfg.Bootstrap})
			return err
		})
	}
	first, second := openDecode, openPrefill
	if rq.prefFirst {
		first, second = openPrefill, openDecode
	}
	if err := first(); err != nil {
		s.record(func(r *Report) { r.Outcomes["open_error:"+grpcCode(err)]++ })
		return
	}
	if err := second(); err != nil {
		// The other side refused (draining, full, gone): a real scheduler
		// gives up on the request and releases what it opened.
		s.record(func(r *Report) { r.Outcomes["open_error:"+grpcCode(err)]++ })
		s.abortBoth(ctx, rq.room)
		s.clearBoth(ctx, rq.room)
		return
	}
	s.maybeAbort(ctx, rq, stageAfterOpen)
	if rq.fault != faultStallDecode {
		pl := &pb.PageList{Indices: dst}
		_ = s.call(ctx, func(ctx context.Context) error {
			_, err := s.decode.SendMetadata(ctx, &pb.SendMetadataRequest{RoomId: rq.room, DstPages: pl, AuxIndex: uint32(dstAux[0])})
			return err
		})
	}
	s.maybeAbort(ctx, rq, stageAfterMetadata)

	var ps, ds *pb.RoomStatus
	sent := false
	var lastChunk time.Time
	var decodeDone time.Time
	tick := time.NewTicker(s.cfg.Tick)
	defer tick.Stop()
	for {
		ps = s.pollPrefill(ctx, rq.room)
		ds = s.pollDecode(ctx, rq.room)
		if decodeDone.IsZero() && terminal(ds.GetState()) {
			decodeDone = time.Now()
		}
		if !sent && ps.GetState() == pb.RoomState_ROOM_STATE_WAITING_FOR_INPUT {
			sent = true
			lastChunk = s.sendChunks(ctx, rq, src, srcAux[0])
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
	s.maybeAbort(ctx, rq, stageAfterSuccess)
	s.record(func(r *Report) {
		r.Outcomes["prefill:"+outcome(ps)]++
		r.Outcomes["decode:"+outcome(ds)]++
		r.WorstTerminal = max(r.WorstTerminal, took)
	})

	switch ds.GetState() {
	case pb.RoomState_ROOM_STATE_SUCCESS:
		good := s.cfg.NoVerify || s.verify(rq, dst, dstAux[0])
		bytes := int64(rq.pages) * int64(nbuf) * s.tl.Buffers[0].ItemLen
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
			}
		})
	case pb.RoomState_ROOM_STATE_FAILED:
		// Failed is visible only once the receiver is fenced (I9): from
		// now on not one byte may land in these pages (R7).
		if s.cfg.Faults.any() {
			for b := 0; b < nbuf; b++ {
				for _, p := range dst {
					fillSentinel(s.dec.region.Pages(b, runOf(p)))
				}
			}
			time.Sleep(20 * time.Millisecond)
			late := false
			for b := 0; b < nbuf && !late; b++ {
				for _, p := range dst {
					if !isSentinel(s.dec.region.Pages(b, runOf(p))) {
						late = true
						break
					}
				}
			}
			if late {
				s.record(func(r *Report) { r.LateWrites++ })
			}
		}
	}
	s.clearBoth(ctx, rq.room)
}

func (s *run) abortBoth(ctx context.Context, room uint64) {
	_ = s.call(ctx, func(ctx context.Context) error {
		_, err := s.prefill.Abort(ctx, &pb.PrefillServiceAbortRequest{RoomId: room, Reason: "sim: open failed"})
		return err
	})
	_ = s.call(ctx, func(ctx context.Context) error {
		_, err := s.decode.Abort(ctx, &pb.DecodeServiceAbortRequest{RoomId: room, Reason: "sim: open failed"})
		return err
	})
}

// clearBoth clears the room on both sides, waiting (bounded) for a room
// that is failing to become visibly terminal first.
func (s *run) clearBoth(ctx context.Context, room uint64) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		var pending bool
		_ = s.call(ctx, func(ctx context.Context) error {
			resp, err := s.prefill.Clear(ctx, &pb.PrefillServiceClearRequest{RoomIds: []uint64{room}})
			pending = err == nil && resp.Results[0].Error == "NOT_TERMINAL"
			return err
		})
		_ = s.call(ctx, func(ctx context.Context) error {
			resp, err := s.decode.Clear(ctx, &pb.DecodeServiceClearRequest{RoomIds: []uint64{room}})
			pending = pending || err == nil && resp.Results[0].Error == "NOT_TERMINAL"
			return err
		})
		if !pending || time.Now().After(deadline) || ctx.Err() != nil {
			return
		}
		time.Sleep(s.cfg.Tick)
	}
}

func (s *run) maybeAbort(ctx context.Context, rq request, stage int) {
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

// sendChunks hands the room's pages over in chunks, as forward passes of
// chunked prefill finish, and returns when the last Send returned.
func (s *run) sendChunks(ctx context.Context, rq request, src []int32, auxRow int32) time.Time {
	for pos := 0; pos < len(src); pos += s.cfg.ChunkPages {
		end := min(pos+s.cfg.ChunkPages, len(src))
		last := end == len(src)
		if last && rq.fault == faultStallPrefill {
			return time.Time{}
		}
		if rq.stage == stageMidSend && pos > 0 {
			s.maybeAbort(ctx, rq, stageMidSend)
		}
		err := s.call(ctx, func(ctx context.Context) error {
			_, err := s.prefill.Send(ctx, &pb.SendRequest{RoomId: rq.room, StartPosition: uint32(pos),
				Pages: &pb.PageList{Indices: src[pos:end]}, Last: last, AuxIndex: uint32(auxRow)})
			return err
		})
		if err != nil {
			return time.Time{}
		}
	}
	if rq.stage == stageMidSend && len(src) <= s.cfg.ChunkPages {
		s.maybeAbort(ctx, rq, stageMidSend)
	}
	return time.Now()
}

func (s *run) pollPrefill(ctx context.Context, room uint64) *pb.RoomStatus {
	var st *pb.RoomStatus
	err := s.call(ctx, func(ctx context.Context) error {
		resp, err := s.prefill.Poll(ctx, &pb.PrefillServicePollRequest{RoomIds: []uint64{room}})
		if err == nil {
			st = resp.Statuses[0]
		}
		return err
	})
	if status.Code(err) == codes.Unavailable && ctx.Err() == nil {
		// The daemon is gone (stopped or killed): for this scheduler the
		// room is over, the way an engine sees its daemon's socket close.
		return unreachable(err)
	}
	return st
}

func (s *run) pollDecode(ctx context.Context, room uint64) *pb.RoomStatus {
	var st *pb.RoomStatus
	err := s.call(ctx, func(ctx context.Context) error {
		resp, err := s.decode.Poll(ctx, &pb.DecodeServicePollRequest{RoomIds: []uint64{room}})
		if err == nil {
			st = resp.Statuses[0]
		}
		return err
	})
	if status.Code(err) == codes.Unavailable && ctx.Err() == nil {
		// The daemon is gone (stopped or killed): for this scheduler the
		// room is over, the way an engine sees its daemon's socket close.
		return unreachable(err)
	}
	return st
}

func (s *run) verify(rq request, dst []int32, auxRow int32) bool {
	for b := range s.tl.Buffers {
		for pos, p := range dst {
			if !checkPage(s.dec.region.Pages(b, runOf(p)), rq.room, b, pos) {
				return false
			}
		}
	}
	return checkPage(s.dec.region.AuxRow(int64(auxRow)), rq.room, auxBuffer, 0)
}
