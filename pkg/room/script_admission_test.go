package room

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// Script commands that drive prefill's real Send (PrefillOwner.Send, the
// gRPC-level call) over a fake transfer.Transport whose admission the
// script controls (see TestScript for the list). A script opts in with
// `dataplane transport on prefill` as its first command: prefill then runs
// its own PrefillData over a registered region instead of the script's
// data-plane stand-in.
//
// The fake reports a held stream's admission (Stream.Admitted) only on the
// script's admit, and its Fence reports nothing to a Send: it is the data
// plane of the bug, stuck behind a peer that is gone. Only the
// owner (at the room's visible Failed), the admitted event or the caller's
// ctx can end a last Send's wait. Its WaitAdmitted panics: no caller may
// wait inside the data plane.

// scriptTransport is the fake transfer.Transport of a prefill node.
type scriptTransport struct {
	e        *scriptEnv
	mu       sync.Mutex
	holdAll  bool
	hold     map[poll.RoomID]bool
	admitted map[poll.RoomID]bool
	streams  map[poll.Key]transfer.Stream
	held     []poll.Key // streams whose last piece waits for the script's admit
}

var _ transfer.Transport = (*scriptTransport)(nil)

func newScriptTransport(e *scriptEnv) *scriptTransport {
	return &scriptTransport{e: e, hold: map[poll.RoomID]bool{}, admitted: map[poll.RoomID]bool{},
		streams: map[poll.Key]transfer.Stream{}}
}

func (s *scriptTransport) AddPeer(string, transfer.Layout) error { return nil }
func (s *scriptTransport) RemovePeer(string)                     {}

func (s *scriptTransport) Open(st transfer.Stream) error {
	s.e.logf("prefill dp: open %s", s.e.key(pkey(st.Key)))
	s.mu.Lock()
	s.streams[pkey(st.Key)] = st
	s.mu.Unlock()
	return nil
}

// Append traces the piece. A last piece is admitted at once, on the
// caller, as a sender with room in its budget does, unless the script
// holds the room's admission.
func (s *scriptTransport) Append(k transfer.Key, p transfer.Piece) error {
	var runs []string
	if len(p.Src) > 0 {
		for _, r := range p.Src[0] {
			runs = append(runs, fmt.Sprintf("%d+%d", r.Start, r.Count))
		}
	}
	what := "pages=" + strings.Join(runs, ",")
	if p.Last {
		what += " last"
	}
	key := pkey(k)
	s.e.logf("prefill dp: append %s %s", s.e.key(key), what)
	if !p.Last {
		return nil
	}
	s.mu.Lock()
	st, held := s.streams[key], s.heldLocked(key.Room)
	if held {
		s.held = append(s.held, key)
	}
	s.mu.Unlock()
	if held {
		s.e.logf("prefill dp: %s waits for admission", s.e.key(key))
	} else if st.Admitted != nil {
		st.Admitted()
	}
	return nil
}

// WaitAdmitted panics: the owner answers a last Send from the admitted
// event, and no goroutine may wait inside the data plane.
func (s *scriptTransport) WaitAdmitted(context.Context, transfer.Key) error {
	panic("scriptTransport: WaitAdmitted called: a caller waits inside the data plane")
}

func (s *scriptTransport) heldLocked(room poll.RoomID) bool {
	return (s.holdAll || s.hold[room]) && !s.admitted[room]
}

// admit lets a room's pieces (room 0: every room's) into the budget and
// reports the held streams' admission.
func (s *scriptTransport) admit(room poll.RoomID) {
	s.mu.Lock()
	if room == 0 {
		s.holdAll, s.hold = false, map[poll.RoomID]bool{}
	} else {
		s.admitted[room] = true
	}
	var now []transfer.Stream
	kept := s.held[:0]
	for _, k := range s.held {
		if room == 0 || k.Room == room {
			s.admitted[k.Room] = true
			now = append(now, s.streams[k])
		} else {
			kept = append(kept, k)
		}
	}
	s.held = kept
	s.mu.Unlock()
	for _, st := range now {
		if st.Admitted != nil {
			st.Admitted()
		}
	}
}

func (s *scriptTransport) Send(context.Context, transfer.SendRequest) error {
	return errors.New("scriptTransport: Send is not used by the owner")
}

// Fence reports nothing to a last Send (see the top of the file). It
// is done at once unless the script holds the room's fence (fence hold on
// prefill): then fence release reports it done, as the transport's
// OnFenced would.
func (s *scriptTransport) Fence(k transfer.Key) bool {
	e, key := s.e, pkey(k)
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.holdAll[sidePrefill] || e.hold[sidePrefill][key.Room] {
		e.held[sidePrefill] = append(e.held[sidePrefill], &heldFence{key: key})
		e.appendLocked(fmt.Sprintf("prefill dp: fence %s held", e.keyLocked(key)))
		return false
	}
	e.appendLocked(fmt.Sprintf("prefill dp: fence %s", e.keyLocked(key)))
	return true
}

func (s *scriptTransport) FenceWait(k transfer.Key) { s.Fence(k) }

func (s *scriptTransport) Close() error { return nil }

// cmdAdmission: dp hold admission on prefill [room] | dp admit on prefill [room].
func (e *scriptEnv) cmdAdmission(a scriptArgs) error {
	const usage = "dp hold admission on prefill [room] | dp admit on prefill [room]"
	if a.on != "prefill" || len(a.pos) == 0 {
		return errors.New(usage)
	}
	if e.tr == nil {
		return errors.New("dp: the script needs `dataplane transport on prefill` first")
	}
	var rest []string
	switch {
	case a.pos[0] == "hold" && len(a.pos) >= 2 && a.pos[1] == "admission":
		rest = a.pos[2:]
	case a.pos[0] == "admit":
		rest = a.pos[1:]
	default:
		return errors.New(usage)
	}
	var room poll.RoomID
	if len(rest) > 0 {
		r, err := scriptArgs{pos: rest}.room(0)
		if err != nil {
			return err
		}
		room = r
	}
	if a.pos[0] == "admit" {
		what := "every room"
		if room != 0 {
			what = fmt.Sprintf("room %d", room)
		}
		e.logf("prefill dp: admit %s", what)
		e.tr.admit(room)
		e.settle()
		return nil
	}
	e.tr.mu.Lock()
	if room == 0 {
		e.tr.holdAll, e.tr.admitted = true, map[poll.RoomID]bool{}
	} else {
		e.tr.hold[room] = true
		delete(e.tr.admitted, room)
	}
	e.tr.mu.Unlock()
	return nil
}

// admissionParked counts prefill's last Sends parked for admission that
// nothing has ended yet: one whose ctx ended (the caller's deadline) is
// about to return, and the script must trace that.
func (e *scriptEnv) admissionParked(s scriptSide) int {
	if s != sidePrefill || e.tr == nil || !e.alive[s] {
		return 0
	}
	n := 0
	c := e.pre.core
	c.withTable(func() {
		for _, list := range c.parked {
			for _, p := range list {
				if p.admission != nil && !p.done && p.admission.Err() == nil {
					n++
				}
			}
		}
	})
	return n
}

// scriptDeadlineCtx is a caller's context whose deadline is on the
// FakeClock: the script ends it (DeadlineExceeded) in the tick that
// reaches it. It wraps a cancelCtx, so the contexts derived from it (the
// Send's wait) end in the same call, before the harness looks again.
type scriptDeadlineCtx struct {
	context.Context
	deadline time.Time
	cancel   context.CancelFunc
}

func (c *scriptDeadlineCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *scriptDeadlineCtx) Err() error {
	if c.Context.Err() != nil {
		return context.DeadlineExceeded
	}
	return nil
}

// expireDeadlines ends the callers' contexts whose deadline the clock
// reached, oldest first, each until quiet.
func (e *scriptEnv) expireDeadlines() {
	now := e.clk.Now()
	kept := e.deadlines[:0]
	var due []*scriptDeadlineCtx
	for _, c := range e.deadlines {
		if !now.Before(c.deadline) {
			due = append(due, c)
		} else {
			kept = append(kept, c)
		}
	}
	e.deadlines = kept
	for _, c := range due {
		c.cancel()
		e.settle()
	}
}

// cmdTransportSend: send <room> pages=... [start=N] [aux=N] [last] [wait]
// [deadline=D], the scheduler's Send on its own goroutine. A Send still
// running once the nodes are quiet waits for admission: that is traced
// with wait, an error without; its answer is traced when it returns.
func (e *scriptEnv) cmdTransportSend(a scriptArgs) error {
	room, err := a.room(0)
	if err != nil {
		return err
	}
	req := &pdlinkv1.SendRequest{RoomId: uint64(room)}
	if p, ok := a.kv["pages"]; ok {
		if req.Pages, err = parsePages(p); err != nil {
			return err
		}
	}
	start, err := a.intArg("start", 0)
	if err != nil {
		return err
	}
	aux, err := a.intArg("aux", 0)
	if err != nil {
		return err
	}
	req.StartPosition, req.AuxIndex = uint32(start), uint32(aux)
	var wait bool
	for _, p := range a.pos[1:] {
		switch p {
		case "last":
			req.Last = true
		case "wait":
			wait = true
		default:
			return fmt.Errorf("send: unknown word %q", p)
		}
	}
	ctx := context.Background()
	if d, ok := a.kv["deadline"]; ok {
		dur, err := time.ParseDuration(d)
		if err != nil {
			return err
		}
		inner, cancel := context.WithCancel(context.Background())
		dc := &scriptDeadlineCtx{Context: inner, deadline: e.clk.Now().Add(dur), cancel: cancel}
		e.deadlines = append(e.deadlines, dc)
		e.t.Cleanup(cancel)
		ctx = dc
	}
	if _, err := e.node(sidePrefill); err != nil {
		e.logf("error: %v", err)
		return nil
	}
	desc := fmt.Sprintf("send %d", room)
	blocked := e.startCall(sidePrefill, desc, "waiting for admission", true, func() string {
		return e.sendAnswer(e.pre.Send(ctx, req))
	})
	if blocked && !wait {
		return fmt.Errorf("%s waits for admission: write `send ... wait` if it should", desc)
	}
	return nil
}

// sendAnswer renders a Send's answer: a room that ended shows its state
// and reasons, as the scheduler reads them off the EndedError.
func (e *scriptEnv) sendAnswer(err error) string {
	var ended *EndedError
	if errors.As(err, &ended) {
		return "ended: " + e.formatVisible(ended.Info, ended.Info.Visible)
	}
	return e.answer(err, "ok")
}
