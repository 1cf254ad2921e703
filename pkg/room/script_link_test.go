package room

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
	"github.com/pdlink/pdlink/pkg/poll"
)

// The link of the scripted environment (script_env_test.go): every frame a
// node sends waits in a per-direction queue here until the script, or an
// auto direction at a quiet moment, releases it to the MemNetwork one at a
// time.

// linkDir is one direction of the control link.
type linkDir int

const (
	dirPD linkDir = iota // prefill -> decode
	dirDP                // decode -> prefill
)

func (d linkDir) String() string { return [...]string{"p->d", "d->p"}[d] }

// sender is the side whose frames travel in d.
func (d linkDir) sender() scriptSide {
	if d == dirPD {
		return sidePrefill
	}
	return sideDecode
}

func parseDir(s string) ([]linkDir, error) {
	switch s {
	case "p->d":
		return []linkDir{dirPD}, nil
	case "d->p":
		return []linkDir{dirDP}, nil
	case "both":
		return []linkDir{dirPD, dirDP}, nil
	}
	return nil, fmt.Errorf("direction %q: want p->d, d->p or both", s)
}

// linkMode says what the harness does with a direction's queued frames
// when the network would otherwise be quiet: auto delivers them, hold
// keeps them for an explicit deliver or drop (heartbeats still flow, so a
// hold is not a partition), cut drops every frame (a partition).
type linkMode int

const (
	linkAuto linkMode = iota
	linkHold
	linkCut
)

func (m linkMode) String() string { return [...]string{"auto", "hold", "cut"}[m] }

// heldFrame is one frame a node sent, waiting in the harness.
type heldFrame struct {
	frame []byte
	ft    conn.FrameType
	typed bool // ft is meaningful (the frame decoded and has a body)
	seq   uint64
	// injected frames are the script's own: always listed in the trace.
	injected bool
	// send hands the frame to the MemNetwork over the sender's socket.
	send func() error
	// receiverGone reports whether nobody would receive it now.
	receiverGone func() bool
}

func (f *heldFrame) heartbeat() bool { return f.typed && f.ft == conn.FrameHeartbeat && !f.injected }

// armedDrop loses the next n frames of a type (any type if !typed) in
// one direction, whenever they are released.
type armedDrop struct {
	n     int
	ft    conn.FrameType
	typed bool
}

func (a *armedDrop) matches(f *heldFrame) bool { return !a.typed || (f.typed && f.ft == a.ft) }

// enqueue is where every frame a node sends lands. An ACK is traced as
// it is sent ("prefill sends ack ..."): a room frame's ACK is the owner's
// last effect of stepping it, so it shows after the effects it answers;
// the link's own (REGISTER, GOODBYE, duplicates, strangers) show where
// the reader sent them.
func (e *scriptEnv) enqueue(d linkDir, f *heldFrame) {
	env := &pdlinkv1.Envelope{}
	if proto.Unmarshal(f.frame, env) == nil {
		f.ft, f.typed = conn.FrameTypeOf(env)
		f.seq = env.GetSeq()
	}
	var sent string
	if f.typed && f.ft == conn.FrameAck && !f.injected {
		sent = fmt.Sprintf("%v sends %s", d.sender(), e.describe(d, f.frame))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if sent != "" {
		e.appendLocked(sent)
	}
	e.queues[d] = append(e.queues[d], f)
}

// flush releases frames until none may go: every frame of an auto
// direction, every frame of any direction if force, heartbeats of a held
// direction; a cut direction loses them. Prefill's frames go first, one at
// a time, each handled in full before the next.
func (e *scriptEnv) flush(force bool) {
	for range maxReleases {
		e.settle()
		d, f, lose := e.next(force)
		if f == nil {
			return
		}
		e.release(d, f, lose)
	}
	e.t.Fatalf("more than %d frames in one flush: the nodes answer each other forever", maxReleases)
}

func (e *scriptEnv) next(force bool) (linkDir, *heldFrame, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for d := range e.queues {
		for i, f := range e.queues[d] {
			mode := e.modes[d]
			if !(force || mode != linkHold || f.heartbeat()) {
				continue
			}
			e.queues[d] = append(e.queues[d][:i:i], e.queues[d][i+1:]...)
			if mode == linkCut && !force {
				return linkDir(d), f, "lost (link cut)"
			}
			return linkDir(d), f, e.armedLocked(linkDir(d), f)
		}
	}
	return 0, nil, ""
}

// armedLocked consumes an armed drop matching f, if any.
func (e *scriptEnv) armedLocked(d linkDir, f *heldFrame) string {
	for i, a := range e.armed[d] {
		if a.matches(f) {
			if a.n--; a.n <= 0 {
				e.armed[d] = append(e.armed[d][:i:i], e.armed[d][i+1:]...)
			}
			return "dropped"
		}
	}
	return ""
}

// release delivers one frame (or loses it, lose saying why) and logs it.
func (e *scriptEnv) release(d linkDir, f *heldFrame, lose string) {
	desc := e.describe(d, f.frame)
	if lose == "" && f.receiverGone() {
		lose = "lost (no receiver)"
	}
	e.mu.Lock()
	if f.heartbeat() && !e.traceHB {
		if lose == "" {
			e.hbSent[d]++
		} else {
			e.hbLost[d]++
		}
	} else if lose != "" {
		e.appendLocked(fmt.Sprintf("%v %s %s", d, desc, lose))
	} else {
		e.appendLocked(fmt.Sprintf("%v %s", d, desc))
	}
	e.mu.Unlock()
	if lose == "" {
		if err := f.send(); err != nil {
			e.logf("%v send failed: %v", d, err)
		}
	}
	e.settle()
}

// describe renders a frame for the trace.
func (e *scriptEnv) describe(d linkDir, b []byte) string {
	env := &pdlinkv1.Envelope{}
	if proto.Unmarshal(b, env) != nil {
		return fmt.Sprintf("<%d bytes, not an envelope>", len(b))
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	key := func(room, nonce uint64) string {
		return e.keyLocked(poll.Key{Room: poll.RoomID(room), Nonce: poll.Nonce(nonce)})
	}
	var s string
	switch b := env.GetBody().(type) {
	case *pdlinkv1.Envelope_Register:
		s = "register endpoint=" + b.Register.GetDataEndpoint()
	case *pdlinkv1.Envelope_Metadata:
		m := b.Metadata
		s = fmt.Sprintf("metadata %s pages=%s aux=%d ranks=%d", key(m.GetRoomId(), m.GetNonce()), formatPages(m.GetDstPages()), m.GetAuxIndex(), m.GetExpectedSenders())
		if r := m.GetRank(); r.GetTpSize() > 1 {
			s += fmt.Sprintf(" rank=%d/%d", r.GetTpRank(), r.GetTpSize())
		}
	case *pdlinkv1.Envelope_Abort:
		s = "abort " + key(b.Abort.GetRoomId(), b.Abort.GetNonce())
		if b.Abort.GetReason() != "" {
			s += " reason=" + b.Abort.GetReason()
		}
	case *pdlinkv1.Envelope_AbortAck:
		s = "abort_ack " + key(b.AbortAck.GetRoomId(), b.AbortAck.GetNonce())
	case *pdlinkv1.Envelope_Status:
		st := b.Status
		s = fmt.Sprintf("status %s %s", key(st.GetRoomId(), st.GetNonce()), strings.ToLower(strings.TrimPrefix(st.GetState().String(), "ROOM_STATE_")))
		if st.GetReason() != "" {
			s += " reason=" + st.GetReason()
		}
	case *pdlinkv1.Envelope_Heartbeat:
		s = fmt.Sprintf("heartbeat live=%d", b.Heartbeat.GetLiveRooms())
	case *pdlinkv1.Envelope_Ack:
		a := b.Ack
		s = fmt.Sprintf("ack seq=%d %s", a.GetAckedSeq(), strings.ToLower(strings.TrimPrefix(a.GetResult().String(), "ACK_RESULT_")))
		if a.GetReason() != "" {
			s += " reason=" + a.GetReason()
		}
	case *pdlinkv1.Envelope_Goodbye:
		s = "goodbye"
	default:
		s = "envelope with no body"
	}
	if env.GetSeq() != 0 {
		s += fmt.Sprintf(" seq=%d", env.GetSeq())
		id := fmt.Sprintf("%s/%d/%d", env.GetSenderInstance(), env.GetEpoch(), env.GetSeq())
		if e.seen[id] {
			s += " (again)"
		}
		e.seen[id] = true
	}
	if env.GetProtocolVersion() != conn.ProtocolVersion {
		s += fmt.Sprintf(" version=%d", env.GetProtocolVersion())
	}
	if inst := env.GetSenderInstance(); inst != e.instance(d.sender()) {
		s += " from=" + inst
	}
	return s
}

func formatPages(p *pdlinkv1.PageList) string {
	var parts []string
	for _, i := range p.GetIndices() {
		parts = append(parts, strconv.Itoa(int(i)))
	}
	for _, r := range p.GetRuns() {
		parts = append(parts, fmt.Sprintf("%d+%d", r.GetStart(), r.GetCount()))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// heldTransport queues every frame its node sends (see scriptEnv).
type heldTransport struct {
	e     *scriptEnv
	inner conn.Transport
	side  scriptSide
}

func (t heldTransport) Listen(ctx context.Context, addr string) (conn.Listener, error) {
	l, err := t.inner.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	hl := &heldListener{e: t.e, inner: l}
	t.e.mu.Lock()
	t.e.preLn = hl
	t.e.mu.Unlock()
	return hl, nil
}

func (t heldTransport) Dial(ctx context.Context, addr string) (conn.Conn, error) {
	c, err := t.inner.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	hc := &heldConn{e: t.e, inner: c}
	t.e.mu.Lock()
	t.e.decConn = hc
	t.e.mu.Unlock()
	return hc, nil
}

type heldListener struct {
	e     *scriptEnv
	inner conn.Listener
}

func (l *heldListener) Recv(ctx context.Context) (conn.Route, []byte, error) {
	return l.inner.Recv(ctx)
}

func (l *heldListener) Addr() string { return l.inner.Addr() }

func (l *heldListener) Close() error { return l.inner.Close() }

func (l *heldListener) Send(ctx context.Context, route conn.Route, frame []byte) error {
	l.e.enqueue(dirPD, l.frame(route, append([]byte(nil), frame...)))
	return nil
}

func (l *heldListener) frame(route conn.Route, b []byte) *heldFrame {
	n := l.e.net
	return &heldFrame{frame: b,
		send:         func() error { return l.inner.Send(context.Background(), route, b) },
		receiverGone: func() bool { return !n.Connected(route) }}
}

type heldConn struct {
	e     *scriptEnv
	inner conn.Conn
}

func (c *heldConn) Recv(ctx context.Context) ([]byte, error) { return c.inner.Recv(ctx) }

func (c *heldConn) Close() error { return c.inner.Close() }

func (c *heldConn) Send(ctx context.Context, frame []byte) error {
	c.e.enqueue(dirDP, c.frame(append([]byte(nil), frame...)))
	return nil
}

func (c *heldConn) frame(b []byte) *heldFrame {
	return &heldFrame{frame: b,
		send:         func() error { return c.inner.Send(context.Background(), b) },
		receiverGone: func() bool { return !c.e.net.Bound(prefillAddr) }}
}

// route is the decode socket's route as prefill's listener sees it.
func (c *heldConn) route() conn.Route { return c.e.net.RouteOf(c.inner) }

// queued returns how many frames wait in each direction.
func (e *scriptEnv) queued() [2]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return [2]int{len(e.queues[dirPD]), len(e.queues[dirDP])}
}

// orderTickFrames sorts the frames queued since before by seq. One tick's
// frames are heartbeats (seq 0), retransmits and new notices; the node
// picks its due retransmits from a map, so their order is random. Sorting
// keeps the new notices in the order they were sent (their seqs grow).
func (e *scriptEnv) orderTickFrames(before [2]int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for d := range e.queues {
		batch := e.queues[d][before[d]:]
		sort.SliceStable(batch, func(i, j int) bool { return batch[i].seq < batch[j].seq })
	}
}
