package conn

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/poll"
)

var updateScripts = flag.Bool("update", false, "rewrite the expected output of testdata/script/*.txt from the current behaviour")

// TestScript runs the two-node scenarios in testdata/script. Each file is
// a list of blocks in the style of etcd's datadriven tests:
//
//	# comments and blank lines are kept as they are
//	<command> <args...>
//	----
//	<expected trace, one line per event, up to a blank line>
//
// The trace of a command is, in the order it happened: the frames
// released on the link ("p->d ..." or "d->p ..."), each followed by what
// its receiver did; every transition the nodes published ("prefill: room
// from -> to"), what the data-plane stand-ins were asked ("decode dp:
// fence ..."), and the answer of the call. Heartbeats are counted, not
// listed (trace heartbeats on lists them). Nonces are random, so they
// read n1, n2... in order of first appearance. -update rewrites every
// expected trace from the current behaviour; a `# BUG:` comment above a
// block marks today's behaviour that the issue asks to change.
//
// Commands (room ids are numbers; <side> is prefill or decode; <dir> is
// p->d, d->p or both):
//
//	open <room> on prefill [nonce=n1|N] [parts=N]   OpenSender
//	open <room> on decode [parts=N]                OpenReceiver (draws the nonce)
//	metadata <room> pages=1,2,3|0+8 [aux=N] [rank=R/S]   SendMetadata
//	send <room> pages=... [last]                   the prefill scheduler's Send
//	complete <room> [part=N]                       decode's data plane wrote and verified a part
//	progress <room> on <side>                      the data plane moved bytes
//	fail <room> <reason> [on <side>]               the data plane failed the transfer
//	abort <room> on <side> [reason]                Abort
//	clear <room> on <side>                         Clear
//	poll <room> on <side>                          what Poll shows (and the table, if it differs)
//	status                                         both tables, peers and links
//	counters                                       rejected frames, retransmits, peer events
//	deliver <dir> [n] [type=T]                     release held frames (all, or the first n)
//	deliver                                        release everything, until quiet
//	drop <dir> [n] [type=T]                        lose held frames; arm the rest of n for later
//	link <dir> auto|hold|cut                       how a direction treats frames (auto: default)
//	advance <duration>                             move time tick by tick (10ms)
//	kill|start|restart prefill|decode              kill -9, start a new instance, both
//	fence hold|release on <side> [room]            make the data plane's Fence block, or let it go
//	inject <dir> garbage|empty|heartbeat|register|metadata|abort|status [room] [nonce=] [pages=] [reason=] [state=] [from=] [version=]
//	trace heartbeats on|off
func TestScript(t *testing.T) {
	files, err := filepath.Glob("testdata/script/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts in testdata/script (%v)", err)
	}
	for _, path := range files {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) { runScriptFile(t, path) })
	}
}

// TestScriptFilesRoundTrip: formatting a parsed script with its own
// expected traces gives the file back, so -update changes nothing but the
// traces (comments, BUG lines and blank lines survive).
func TestScriptFilesRoundTrip(t *testing.T) {
	files, _ := filepath.Glob("testdata/script/*.txt")
	for _, path := range files {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		blocks, trailing, err := parseScript(string(src))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		want := make([][]string, len(blocks))
		for i, b := range blocks {
			want[i] = b.want
		}
		if got := formatScript(blocks, want, trailing); got != string(src) {
			t.Errorf("%s does not survive a parse and a rewrite:\n%s", path, got)
		}
	}
	if _, _, err := parseScript("status\nno separator\n"); err == nil {
		t.Error("a command without ---- parsed")
	}
}

// scriptBlock is one command of a script and its expected trace.
type scriptBlock struct {
	prelude []string // comments and blank lines before the command
	line    int      // of the command, 1-based
	cmd     string
	want    []string
}

func parseScript(src string) (blocks []scriptBlock, trailing []string, err error) {
	lines := strings.Split(strings.TrimSuffix(src, "\n"), "\n")
	for i := 0; i < len(lines); {
		var b scriptBlock
		for i < len(lines) && (strings.TrimSpace(lines[i]) == "" || strings.HasPrefix(lines[i], "#")) {
			b.prelude = append(b.prelude, lines[i])
			i++
		}
		if i == len(lines) {
			return blocks, b.prelude, nil
		}
		b.line, b.cmd = i+1, lines[i]
		i++
		if i == len(lines) || lines[i] != "----" {
			return nil, nil, fmt.Errorf("line %d: want ---- after the command %q", b.line, b.cmd)
		}
		for i++; i < len(lines) && lines[i] != ""; i++ {
			b.want = append(b.want, lines[i])
		}
		i++ // the blank line that ends the block
		blocks = append(blocks, b)
	}
	return blocks, nil, nil
}

func formatScript(blocks []scriptBlock, got [][]string, trailing []string) string {
	var lines []string
	for i, b := range blocks {
		lines = append(lines, b.prelude...)
		lines = append(lines, b.cmd, "----")
		lines = append(lines, got[i]...)
		lines = append(lines, "")
	}
	lines = append(lines, trailing...)
	return strings.Join(lines, "\n")
}

func runScriptFile(t *testing.T, path string) {
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blocks, trailing, err := parseScript(string(src))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	e := newScriptEnv(t)
	e.takeOutput() // the start of both nodes is not part of any block
	got := make([][]string, len(blocks))
	for i, b := range blocks {
		if err := e.run(b.cmd); err != nil {
			t.Fatalf("%s:%d: %s: %v", path, b.line, b.cmd, err)
		}
		got[i] = e.takeOutput()
		if !*updateScripts && strings.Join(got[i], "\n") != strings.Join(b.want, "\n") {
			t.Errorf("%s:%d: %s\n--- want\n%s\n--- got\n%s", path, b.line, b.cmd, strings.Join(b.want, "\n"), strings.Join(got[i], "\n"))
		}
	}
	for s, alive := range e.alive {
		if !alive {
			continue
		}
		c := e.pre.core
		if scriptSide(s) == sideDecode {
			c = e.dec.core
		}
		if err := c.checkInvariants(); err != nil {
			t.Errorf("%s: %v invariants at the end: %v", path, scriptSide(s), err)
		}
	}
	if *updateScripts {
		if out := formatScript(blocks, got, trailing); out != string(src) {
			if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// scriptArgs are a command's arguments: positional ones, key=value ones
// and "on <side>".
type scriptArgs struct {
	pos []string
	kv  map[string]string
	on  string
}

func parseArgs(fields []string) scriptArgs {
	a := scriptArgs{kv: map[string]string{}}
	for i := 0; i < len(fields); i++ {
		f := fields[i]
		if f == "on" && i+1 < len(fields) {
			a.on = fields[i+1]
			i++
			continue
		}
		if k, v, ok := strings.Cut(f, "="); ok {
			a.kv[k] = v
			continue
		}
		a.pos = append(a.pos, f)
	}
	return a
}

func (a scriptArgs) room(i int) (poll.RoomID, error) {
	if i >= len(a.pos) {
		return 0, fmt.Errorf("missing room id")
	}
	v, err := strconv.ParseUint(a.pos[i], 10, 63)
	return poll.RoomID(v), err
}

func (a scriptArgs) side() (scriptSide, error) { return parseSide(a.on) }

func (a scriptArgs) intArg(name string, def int) (int, error) {
	s, ok := a.kv[name]
	if !ok {
		return def, nil
	}
	return strconv.Atoi(s)
}

func parsePages(s string) (*pdlinkv1.PageList, error) {
	p := &pdlinkv1.PageList{}
	for _, part := range strings.Split(s, ",") {
		if start, count, ok := strings.Cut(part, "+"); ok {
			a, err1 := strconv.Atoi(start)
			b, err2 := strconv.Atoi(count)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("pages %q: a run is start+count", s)
			}
			p.Runs = append(p.Runs, &pdlinkv1.PageRun{Start: int32(a), Count: int32(b)})
			continue
		}
		v, err := strconv.Atoi(part)
		if err != nil {
			return nil, fmt.Errorf("pages %q: %v", s, err)
		}
		p.Indices = append(p.Indices, int32(v))
	}
	return p, nil
}

func frameTypeArg(s string) (FrameType, error) {
	for _, ft := range AllFrameTypes() {
		if ft.String() == s {
			return ft, nil
		}
	}
	return 0, fmt.Errorf("frame type %q", s)
}

// node is the running node of a side, or an error saying it is not.
func (e *scriptEnv) node(s scriptSide) (*core, error) {
	if !e.alive[s] {
		return nil, fmt.Errorf("%v is not running", s)
	}
	if s == sidePrefill {
		return e.pre.core, nil
	}
	return e.dec.core, nil
}

// run performs one command, then lets frames flow (auto directions,
// heartbeats) until quiet, and notes what stays held.
func (e *scriptEnv) run(cmd string) error {
	fields := strings.Fields(cmd)
	a := parseArgs(fields[1:])
	var err error
	switch fields[0] {
	case "open":
		err = e.cmdOpen(a)
	case "metadata":
		err = e.cmdMetadata(a)
	case "send":
		err = e.cmdSend(a)
	case "complete", "progress", "fail":
		err = e.cmdDataPlane(fields[0], a)
	case "abort", "clear", "poll":
		err = e.cmdRoom(fields[0], a)
	case "status":
		e.cmdStatus()
	case "counters":
		e.cmdCounters()
	case "deliver", "drop":
		err = e.cmdRelease(fields[0], a)
	case "link":
		err = e.cmdLink(a)
	case "advance":
		err = e.cmdAdvance(a)
	case "kill", "start", "restart":
		err = e.cmdLifecycle(fields[0], a)
	case "fence":
		err = e.cmdFence(a)
	case "inject":
		err = e.cmdInject(a)
	case "trace":
		if len(a.pos) != 2 || a.pos[0] != "heartbeats" {
			return fmt.Errorf("trace heartbeats on|off")
		}
		e.mu.Lock()
		e.traceHB = a.pos[1] == "on"
		e.mu.Unlock()
	default:
		return fmt.Errorf("unknown command %q", fields[0])
	}
	if err != nil {
		return err
	}
	e.flush(false)
	e.noteHeld()
	return nil
}

// noteHeld logs the frames left in held directions.
func (e *scriptEnv) noteHeld() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for d, q := range e.queues {
		if len(q) == 0 {
			continue
		}
		names := make([]string, len(q))
		for i, f := range q {
			names[i] = "?"
			if f.typed {
				names[i] = f.ft.String()
			}
		}
		e.appendLocked(fmt.Sprintf("held %v: %s", linkDir(d), strings.Join(names, ", ")))
	}
}

func (e *scriptEnv) cmdOpen(a scriptArgs) error {
	room, err := a.room(0)
	if err != nil {
		return err
	}
	s, err := a.side()
	if err != nil {
		return err
	}
	parts, err := a.intArg("parts", 0)
	if err != nil {
		return err
	}
	if _, err := e.node(s); err != nil {
		e.logf("error: %v", err)
		return nil
	}
	desc := fmt.Sprintf("open %d on %v", room, s)
	if s == sideDecode {
		e.call(s, desc, func() string {
			nonce, err := e.dec.Open(room, prefillAddr, parts)
			if err != nil {
				return e.answer(err, "")
			}
			return "ok: nonce " + e.key(poll.Key{Room: room, Nonce: nonce})
		})
		return nil
	}
	var nonce poll.Nonce
	if v, ok := a.kv["nonce"]; ok {
		if nonce, err = e.nonceArg(v); err != nil {
			return err
		}
	}
	e.call(s, desc, func() string {
		info, err := e.pre.Open(room, nonce, parts)
		if err != nil {
			return e.answer(err, "")
		}
		return "ok: " + e.formatVisible(info, info.Visible)
	})
	return nil
}

// formatVisible renders the state a scheduler sees, with the reasons once
// Failed is visible.
func (e *scriptEnv) formatVisible(info poll.RoomInfo, visible poll.State) string {
	s := visible.String()
	if visible == poll.Failed {
		s += " reason=" + string(info.Reason)
		if info.PeerReason != "" {
			s += " peer_reason=" + string(info.PeerReason)
		}
	}
	return s
}

func (e *scriptEnv) cmdMetadata(a scriptArgs) error {
	room, err := a.room(0)
	if err != nil {
		return err
	}
	pages, err := parsePages(a.kv["pages"])
	if err != nil {
		return err
	}
	aux, err := a.intArg("aux", 0)
	if err != nil {
		return err
	}
	req := MetadataRequest{DstPages: pages, AuxIndex: uint32(aux), TPSize: 1}
	if r, ok := a.kv["rank"]; ok {
		rank, size, _ := strings.Cut(r, "/")
		rv, err1 := strconv.ParseUint(rank, 10, 32)
		sv, err2 := strconv.ParseUint(size, 10, 32)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("rank %q: want R/S", r)
		}
		req.TPRank, req.TPSize = uint32(rv), uint32(sv)
	}
	if _, err := e.node(sideDecode); err != nil {
		e.logf("error: %v", err)
		return nil
	}
	e.call(sideDecode, fmt.Sprintf("metadata %d", room), func() string {
		return e.answer(e.dec.SendMetadata(room, req), "ok")
	})
	return nil
}

func (e *scriptEnv) cmdSend(a scriptArgs) error {
	room, err := a.room(0)
	if err != nil {
		return err
	}
	pages, err := parsePages(a.kv["pages"])
	if err != nil {
		return err
	}
	last := len(a.pos) > 1 && a.pos[1] == "last"
	if _, err := e.node(sidePrefill); err != nil {
		e.logf("error: %v", err)
		return nil
	}
	e.call(sidePrefill, fmt.Sprintf("send %d", room), func() string {
		if err := e.pre.FirstSend(room); err != nil {
			return e.answer(err, "")
		}
		info, _ := e.pre.Get(room)
		what := "pages=" + formatPages(pages)
		if last {
			what += " last"
		}
		e.logf("prefill dp: sending %s %s", e.key(info.Key), what)
		return "ok"
	})
	return nil
}

// cmdDataPlane plays a data plane's callback: decode wrote and verified a
// part (complete), bytes moved (progress), the transfer failed (fail).
func (e *scriptEnv) cmdDataPlane(verb string, a scriptArgs) error {
	room, err := a.room(0)
	if err != nil {
		return err
	}
	s := sideDecode
	switch {
	case verb == "fail" && a.on == "":
		s = sidePrefill
	case verb != "complete":
		if s, err = a.side(); err != nil {
			return err
		}
	}
	c, err := e.node(s)
	if err != nil {
		e.logf("error: %v", err)
		return nil
	}
	info, err := c.Get(room)
	if err != nil {
		e.logf("error: %s", e.sanitize(err.Error()))
		return nil
	}
	key := info.Key
	desc := fmt.Sprintf("%s %d on %v", verb, room, s)
	switch verb {
	case "complete":
		part, err := a.intArg("part", 0)
		if err != nil {
			return err
		}
		if e.dps[sideDecode].isFenced(key) {
			e.logf("decode dp: %s is fenced: nothing written", e.key(key))
			return nil
		}
		e.call(s, desc, func() string {
			e.dec.OnProgress(key)
			e.dec.OnPartDone(key, part)
			return "ok"
		})
	case "progress":
		e.call(s, desc, func() string {
			if s == sidePrefill {
				e.pre.OnProgress(key)
			} else {
				e.dec.OnProgress(key)
			}
			return "ok"
		})
	case "fail":
		if len(a.pos) < 2 {
			return fmt.Errorf("fail <room> <reason>")
		}
		reason := poll.Reason(a.pos[1])
		e.call(s, desc, func() string {
			if s == sidePrefill {
				e.pre.OnFailed(key, reason)
			} else {
				e.dec.OnFailed(key, reason)
			}
			return "ok"
		})
	}
	return nil
}

func (e *scriptEnv) cmdRoom(verb string, a scriptArgs) error {
	room, err := a.room(0)
	if err != nil {
		return err
	}
	s, err := a.side()
	if err != nil {
		return err
	}
	c, err := e.node(s)
	if err != nil {
		e.logf("error: %v", err)
		return nil
	}
	switch verb {
	case "abort":
		var reason poll.Reason
		if len(a.pos) > 1 {
			reason = poll.Reason(a.pos[1])
		}
		e.call(s, fmt.Sprintf("abort %d on %v", room, s), func() string {
			if s == sidePrefill {
				return e.answer(e.pre.Abort(room, reason), "ok")
			}
			return e.answer(e.dec.Abort(room, reason), "ok")
		})
	case "clear":
		e.call(s, fmt.Sprintf("clear %d on %v", room, s), func() string {
			errs := make([]error, 1)
			c.Clear([]poll.RoomID{room}, errs)
			return e.answer(errs[0], "ok")
		})
	case "poll":
		visible := c.Poll([]poll.RoomID{room}, nil)[0]
		info, err := c.Get(room)
		line := visible.String()
		if err == nil {
			line = e.formatVisible(info, visible)
			if info.State != visible {
				line += fmt.Sprintf(" (table: %s, fenced=%v)", e.formatVisible(info, info.State), info.Fenced)
			}
		}
		e.logf("%s", line)
	}
	return nil
}

func (e *scriptEnv) cmdStatus() {
	for _, s := range []scriptSide{sidePrefill, sideDecode} {
		c, err := e.node(s)
		if err != nil {
			e.logf("%s: not running", e.instance(s))
			continue
		}
		st := c.Stats()
		e.logf("%s: rooms=%d inflight=%d tombstones=%d", e.instance(s), st.Rooms, st.Inflight, st.Tombstones)
		now := c.now()
		for _, in := range roomsOf(c) {
			line := fmt.Sprintf("  %s %s", e.key(in.Key), e.formatVisible(in, in.State))
			if in.Visible != in.State {
				line += " visible=" + in.Visible.String()
			}
			line += fmt.Sprintf(" parts=%d/%d", popcount(in.PartsDone), in.Parts)
			line += fmt.Sprintf(" deadline=+%v", time.Duration(in.Deadline-now))
			e.logf("%s", line)
		}
		var peers []PeerInfo
		if s == sidePrefill {
			peers = e.pre.Peers()
		} else {
			peers = e.dec.Peers()
		}
		for _, p := range peers {
			up := "down"
			if p.Up {
				up = "up"
			}
			e.logf("  peer %s %s", p.Instance, up)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.appendLocked(fmt.Sprintf("links: p->d %v, d->p %v", e.modes[dirPD], e.modes[dirDP]))
}

func popcount(x uint64) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

func (e *scriptEnv) cmdCounters() {
	for _, s := range []scriptSide{sidePrefill, sideDecode} {
		var c Counters
		switch {
		case !e.alive[s]:
			e.logf("%s: not running", e.instance(s))
			continue
		case s == sidePrefill:
			c = e.pre.Counters()
		default:
			c = e.dec.Counters()
		}
		var parts []string
		for _, r := range AllRejectReasons() {
			if n := c.Rejected(r); n > 0 {
				parts = append(parts, fmt.Sprintf("rejected_%s=%d", r, n))
			}
		}
		for _, x := range []struct {
			name string
			n    uint64
		}{{"retransmits", c.Retransmits}, {"give_ups", c.GiveUps}, {"worker_restarts", c.WorkerRestarts},
			{"peers_lost", c.PeersLost}, {"peer_restarts", c.PeerRestarts}, {"peer_goodbyes", c.PeerGoodbyes}} {
			if x.n > 0 {
				parts = append(parts, fmt.Sprintf("%s=%d", x.name, x.n))
			}
		}
		if len(parts) == 0 {
			parts = append(parts, "none")
		}
		e.logf("%s: %s", e.instance(s), strings.Join(parts, " "))
	}
}

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
	var ft FrameType
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
		e.flush(false)
	}
	return nil
}

// advanceClock moves the FakeClock, which hands each node its tick and
// waits until it was handled. A tick that fences a room whose fence the
// script holds would wait forever: that fails the script instead.
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
		e.t.Fatalf("a tick did not finish within %v: it is blocked in a held fence (release it before advancing)", quietLimit)
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
		e.releaseFences(s, room, "")
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
	env := &pdlinkv1.Envelope{ProtocolVersion: ProtocolVersion, SenderInstance: inst, Epoch: epoch}
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
