package room

import (
	"fmt"
	"strconv"
	"time"

	"google.golang.org/protobuf/proto"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

// Script commands that act on the link, time, processes and fences (see
// TestScript for the list).

// cmdRelease delivers or drops held frames.
func (e *scriptEnv) cmdRelease(verb string, a scriptArgs) error {
	if verb == "deliver" && len(a.pos) == 0 {
		e.flush(true)
		return nil
	}
	if len(a.pos) == 0 {
		return fmt.Errorf("%s <dir> [n] [type=T]", verb)
	}
	dirs, err := parseDir(a.pos[0])
	if err != nil {
		return err
	}
	n, limited := -1, len(a.pos) > 1
	if limited {
		if n, err = strconv.Atoi(a.pos[1]); err != nil {
			return err
		}
	}
	var ft conn.FrameType
	typed := false
	if t, ok := a.kv["type"]; ok {
		if ft, err = frameTypeArg(t); err != nil {
			return err
		}
		typed = true
	}
	filter := armedDrop{ft: ft, typed: typed}
	for _, d := range dirs {
		done := 0
		for n < 0 || done < n {
			f := e.takeHeld(d, &filter)
			if f == nil {
				break
			}
			done++
			if verb == "drop" {
				e.release(d, f, "dropped")
				continue
			}
			e.mu.Lock()
			lose := e.armedLocked(d, f)
			e.mu.Unlock()
			e.release(d, f, lose)
		}
		if verb == "drop" && limited && done < n {
			e.mu.Lock()
			e.armed[d] = append(e.armed[d], &armedDrop{n: n - done, ft: ft, typed: typed})
			what := "frames"
			if typed {
				what = ft.String() + " frames"
			}
			e.appendLocked(fmt.Sprintf("armed: the next %d %s %v will be dropped", n-done, what, d))
			e.mu.Unlock()
		}
	}
	return nil
}

// takeHeld removes the first held frame of d that filter matches.
func (e *scriptEnv) takeHeld(d linkDir, filter *armedDrop) *heldFrame {
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, f := range e.queues[d] {
		if filter.matches(f) {
			e.queues[d] = append(e.queues[d][:i:i], e.queues[d][i+1:]...)
			return f
		}
	}
	return nil
}

func (e *scriptEnv) cmdLink(a scriptArgs) error {
	if len(a.pos) != 2 {
		return fmt.Errorf("link <dir> auto|hold|cut")
	}
	dirs, err := parseDir(a.pos[0])
	if err != nil {
		return err
	}
	var m linkMode
	switch a.pos[1] {
	case "auto":
		m = linkAuto
	case "hold":
		m = linkHold
	case "cut":
		m = linkCut
	default:
		return fmt.Errorf("link mode %q", a.pos[1])
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, d := range dirs {
		e.modes[d] = m
	}
	return nil
}

func (e *scriptEnv) cmdAdvance(a scriptArgs) error {
	if len(a.pos) != 1 {
		return fmt.Errorf("advance <duration>")
	}
	d, err := time.ParseDuration(a.pos[0])
	if err != nil || d <= 0 || d%tTick != 0 {
		return fmt.Errorf("advance %q: want a positive multiple of %v", a.pos[0], tTick)
	}
	e.flush(false)
	for range d / tTick {
		e.advanceClock(tTick)
		e.expireDeadlines()
		e.flush(false)
	}
	return nil
}

// advanceClock moves the FakeClock, which hands each node its tick and
// waits until it was handled (bounded: a tick that never ends fails the
// script).
func (e *scriptEnv) advanceClock(d time.Duration) {
	before := e.queued()
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.clk.Advance(d)
	}()
	select {
	case <-done:
	case <-time.After(quietLimit):
		e.t.Fatalf("a tick did not finish within %v", quietLimit)
	}
	e.settle()
	e.orderTickFrames(before)
}

func (e *scriptEnv) cmdLifecycle(verb string, a scriptArgs) error {
	if len(a.pos) != 1 {
		return fmt.Errorf("%s prefill|decode", verb)
	}
	s, err := parseSide(a.pos[0])
	if err != nil {
		return err
	}
	switch verb {
	case "kill":
		if !e.alive[s] {
			return fmt.Errorf("%v is not running", s)
		}
		e.kill(s)
	case "start":
		if e.alive[s] {
			return fmt.Errorf("%v is running", s)
		}
		e.start(s)
	case "restart":
		if e.alive[s] {
			e.kill(s)
		}
		// The new process starts later than the old one: a higher epoch.
		e.advanceClock(time.Millisecond)
		e.start(s)
	}
	return nil
}

func (e *scriptEnv) cmdFence(a scriptArgs) error {
	if len(a.pos) < 1 {
		return fmt.Errorf("fence hold|release on <side> [room]")
	}
	s, err := a.side()
	if err != nil {
		return err
	}
	var room poll.RoomID
	if len(a.pos) > 1 {
		if room, err = a.room(1); err != nil {
			return err
		}
	}
	switch a.pos[0] {
	case "hold":
		e.holdFences(s, room)
	case "release":
		e.releaseFences(s, room)
	default:
		return fmt.Errorf("fence %q", a.pos[0])
	}
	return nil
}

// cmdInject queues a hand-made frame on a direction, as if its sender had
// sent it over its own socket (or as another instance, from=).
func (e *scriptEnv) cmdInject(a scriptArgs) error {
	if len(a.pos) < 2 {
		return fmt.Errorf("inject <dir> <kind> ...")
	}
	dirs, err := parseDir(a.pos[0])
	if err != nil || len(dirs) != 1 {
		return fmt.Errorf("inject needs one direction")
	}
	d := dirs[0]
	c, err := e.node(d.sender())
	if err != nil {
		return err
	}
	inst, epoch := c.Instance()
	if v, ok := a.kv["from"]; ok {
		inst, epoch = v, 99
	}
	env := &pdlinkv1.Envelope{ProtocolVersion: conn.ProtocolVersion, SenderInstance: inst, Epoch: epoch}
	if v, ok := a.kv["version"]; ok {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			return err
		}
		env.ProtocolVersion = uint32(n)
	}
	var room poll.RoomID
	if len(a.pos) > 2 {
		if room, err = a.room(2); err != nil {
			return err
		}
	}
	var nonce poll.Nonce
	if v, ok := a.kv["nonce"]; ok {
		if nonce, err = e.nonceArg(v); err != nil {
			return err
		}
	}
	e.mu.Lock()
	e.injects++
	seq := uint64(1)<<32 + e.injects
	e.mu.Unlock()
	var frame []byte
	switch kind := a.pos[1]; kind {
	case "garbage":
		frame = []byte{0xff, 0xff, 0xff, 0x01}
	case "empty":
		env.Seq = seq
	case "heartbeat":
		env.Body = &pdlinkv1.Envelope_Heartbeat{Heartbeat: &pdlinkv1.Heartbeat{}}
	case "register":
		env.Seq = seq
		env.Body = &pdlinkv1.Envelope_Register{Register: &pdlinkv1.Register{InstanceId: inst, DataEndpoint: "10.6.6.6:1"}}
	case "metadata":
		pages, err := parsePages(a.kv["pages"])
		if err != nil {
			return err
		}
		env.Seq = seq
		env.Body = &pdlinkv1.Envelope_Metadata{Metadata: &pdlinkv1.Metadata{RoomId: uint64(room), Nonce: uint64(nonce), DstPages: pages, ExpectedSenders: 1}}
	case "abort":
		env.Seq = seq
		env.Body = &pdlinkv1.Envelope_Abort{Abort: &pdlinkv1.Abort{RoomId: uint64(room), Nonce: uint64(nonce), Reason: a.kv["reason"]}}
	case "status":
		state := pdlinkv1.RoomState_ROOM_STATE_SUCCESS
		if a.kv["state"] == "failed" {
			state = pdlinkv1.RoomState_ROOM_STATE_FAILED
		}
		env.Seq = seq
		env.Body = &pdlinkv1.Envelope_Status{Status: &pdlinkv1.Status{RoomId: uint64(room), Nonce: uint64(nonce), State: state, Reason: a.kv["reason"]}}
	default:
		return fmt.Errorf("inject kind %q", kind)
	}
	if frame == nil {
		if frame, err = proto.Marshal(env); err != nil {
			return err
		}
	}
	e.mu.Lock()
	ln, dc := e.preLn, e.decConn
	e.mu.Unlock()
	if dc == nil || (d == dirPD && ln == nil) {
		return fmt.Errorf("inject: the nodes have no link yet (open a room on decode first)")
	}
	var f *heldFrame
	if d == dirPD {
		f = ln.frame(dc.route(), frame)
	} else {
		f = dc.frame(frame)
	}
	f.injected = true
	e.enqueue(d, f)
	return nil
}
