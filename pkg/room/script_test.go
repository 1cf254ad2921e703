package room

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	pdlinkv1 "github.com/pdlink/pdlink/api/pdlink/v1"
	"github.com/pdlink/pdlink/pkg/conn"
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
//	open <room> on prefill [nonce=n1|N] [ranks=N] [rank=R/S]   OpenSender (a rank of S > 1 joins its siblings' room)
//	open <room> on decode [ranks=N] [rank=R/S]     OpenReceiver (draws the nonce; a sibling rank joins)
//	metadata <room> pages=1,2,3|0+8 [aux=N] [rank=R/S]   SendMetadata
//	send <room> pages=... [last]                   the prefill scheduler's Send
//	complete <room> [rank=N]                       decode's data plane wrote and verified a rank's pages
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
//	fence hold|release on <side> [room]            the data plane's Fence answers "not done" until released (then Fenced)
//	inject <dir> garbage|empty|heartbeat|register|metadata|abort|status [room] [nonce=] [pages=] [reason=] [state=] [from=] [version=]
//	trace heartbeats on|off
//	drain <side> [deadline=D] [grace=G] [cap=C]     Drain (SIGTERM) on its own goroutine; traces its report when it returns
//	panic fence|bind on <side> [room] [times=N]     the data plane's next such call panics
//
// A script whose first command is `dataplane transport on prefill` runs
// prefill's own data plane (PrefillData over a registered region) on a fake
// transfer.Transport (script_admission_test.go); send is then the
// gRPC-level PrefillOwner.Send:
//
//	send <room> pages=... [start=N] [aux=N] [last] [wait] [deadline=D]
//	                                               wait: it may wait for admission (traced; its answer when it returns);
//	                                               deadline: the caller's ctx ends D later on the clock
//	dp hold admission on prefill [room]            the transport admits no piece of the room (of any room)
//	dp admit on prefill [room]                     until this: the room's (every room's) waits return admitted
//
// The fake transport's fence never ends a wait for admission; fence hold
// and release on prefill hold and report its fences as they do the
// stand-in's.
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
	// A script that drives prefill's own data plane says so first.
	e := newScriptEnvWith(t, len(blocks) > 0 && blocks[0].cmd == "dataplane transport on prefill")
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

func frameTypeArg(s string) (conn.FrameType, error) {
	for _, ft := range conn.AllFrameTypes() {
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
		if e.transportDP {
			err = e.cmdTransportSend(a)
		} else {
			err = e.cmdSend(a)
		}
	case "dataplane":
		if cmd != "dataplane transport on prefill" || !e.transportDP || e.gen != [2]int{1, 1} {
			return fmt.Errorf("dataplane transport on prefill: only as a script's first command")
		}
	case "dp":
		err = e.cmdAdmission(a)
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
	case "drain":
		err = e.cmdDrain(a)
	case "panic":
		err = e.cmdPanic(a)
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
