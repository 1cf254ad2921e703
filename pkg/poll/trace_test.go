package poll

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the current output")

// TestTraces runs the scripts in testdata/*.txt and compares the full trace
// (commands, errors, effects, states) with testdata/*.golden.
//
// Script lines: "side prefill|decode", "advance <duration>", "poll <ids>",
// or "<event> <room> [nonce=N] [peer=P] [reason=R] [ranks=N] [rank=N]"
// where <event> is an EventKind name (open, metadata, first_chunk, ...).
func TestTraces(t *testing.T) {
	scripts, _ := filepath.Glob("testdata/*.txt")
	if len(scripts) == 0 {
		t.Fatal("no scripts")
	}
	for _, path := range scripts {
		t.Run(filepath.Base(path), func(t *testing.T) {
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			got := runTrace(t, string(src))
			golden := strings.TrimSuffix(path, ".txt") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if got != string(want) {
				t.Errorf("trace differs from %s (run with -update if intended):\n%s", golden, got)
			}
		})
	}
}

func runTrace(t *testing.T, script string) string {
	var h *harness
	var out strings.Builder
	for n, line := range strings.Split(script, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			out.WriteString(line + "\n")
			continue
		}
		fmt.Fprintf(&out, "> %s\n", line)
		f := strings.Fields(line)
		fail := func(format string, a ...any) { t.Fatalf("line %d: %s", n+1, fmt.Sprintf(format, a...)) }
		switch f[0] {
		case "side":
			side := Prefill
			if f[1] == "decode" {
				side = Decode
			}
			h = newHarness(t, side)
			continue
		case "advance":
			d, err := time.ParseDuration(f[1])
			if err != nil {
				fail("%v", err)
			}
			h.advance(d)
		case "poll":
			var ids []RoomID
			for _, s := range f[1:] {
				v, _ := strconv.ParseUint(s, 10, 64)
				ids = append(ids, RoomID(v))
			}
			fmt.Fprintf(&out, "  states %v\n", h.tab.Poll(ids, nil))
			continue
		default:
			ev, err := parseEvent(f)
			if err != nil {
				fail("%v", err)
			}
			if err := h.step(ev); err != nil {
				fmt.Fprintf(&out, "  error: %v\n", err)
			}
		}
		for _, e := range h.take() {
			fmt.Fprintf(&out, "  %s at=%v\n", formatEffect(e), time.Duration(e.At))
		}
	}
	return out.String()
}

func parseEvent(f []string) (Event, error) {
	var ev Event
	for k := EventKind(1); int(k) < numEventKinds; k++ {
		if k.String() == f[0] {
			ev.Kind = k
		}
	}
	if ev.Kind == evNone {
		return ev, fmt.Errorf("unknown event %q", f[0])
	}
	for _, arg := range f[1:] {
		name, val, isKV := strings.Cut(arg, "=")
		if !isKV {
			v, err := strconv.ParseUint(arg, 10, 64)
			if err != nil {
				return ev, err
			}
			ev.Key.Room = RoomID(v)
			continue
		}
		if name == "reason" {
			ev.Reason = Reason(val)
			continue
		}
		v, err := strconv.ParseUint(val, 10, 64)
		if err != nil {
			return ev, err
		}
		switch name {
		case "nonce":
			ev.Key.Nonce = Nonce(v)
		case "peer":
			ev.Peer = PeerID(v)
		case "ranks":
			ev.Ranks = uint8(v)
		case "rank":
			ev.Rank = uint8(v)
		default:
			return ev, fmt.Errorf("unknown argument %q", name)
		}
	}
	return ev, nil
}
