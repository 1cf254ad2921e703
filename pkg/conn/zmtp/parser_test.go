package zmtp

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

var testLimits = limits{maxFrame: 1 << 10, maxCommand: 256, maxParts: 3, peerType: "DEALER"}

// feedChunks feeds b in chunks cut by split and returns the first violation.
func feedChunks(p *parser, b []byte, split func(rest int) int) *violation {
	for len(b) > 0 {
		n := min(max(split(len(b)), 1), len(b))
		if v := p.feed(b[:n]); v != nil {
			return v
		}
		b = b[n:]
	}
	return nil
}

func TestParserVerdictDoesNotDependOnChunking(t *testing.T) {
	hs := handshake("peer")
	withGreeting := func(mod func(g []byte)) []byte {
		g := greeting()
		mod(g)
		return cat(g, ready("DEALER", "x"))
	}
	cases := []struct {
		name  string
		in    []byte
		want  string // "" = accepted
		ready bool
	}{
		{"handshake", hs, "", true},
		{"handshake then frames", cat(hs, frame(0, []byte("a")), frame(flagLong, bytes.Repeat([]byte{1}, 300)),
			frame(flagMore, []byte("p1")), frame(0, []byte("p2")), frame(0, nil)), "", true},
		{"lower-case socket-type", cat(greeting(), command(cmdReady, props("socket-type", "DEALER"))), "", true},
		{"version 3.1", withGreeting(func(g []byte) { g[11] = 1 }), "", true},
		{"ping pong error after ready", cat(hs, command(cmdPing, []byte{0, 1}), command(cmdPong, nil),
			command(cmdError, []byte("\x03bye"))), "", true},
		{"greeting only", greeting(), "", false},
		{"partial ready", hs[:len(hs)-3], "", false},

		{"bad signature", withGreeting(func(g []byte) { g[0] = 'G' }), ReasonBadGreeting, false},
		{"bad signature footer", withGreeting(func(g []byte) { g[9] = 0 }), ReasonBadGreeting, false},
		{"version 2", withGreeting(func(g []byte) { g[10] = 2 }), ReasonBadGreeting, false},
		{"mechanism PLAIN", withGreeting(func(g []byte) { copy(g[12:], "PLAIN") }), ReasonBadGreeting, false},
		{"as-server 1", withGreeting(func(g []byte) { g[32] = 1 }), ReasonBadGreeting, false},

		{"cut ready (crash input)", crashCutReady, ReasonBadCommand, false},
		{"ready without socket-type (crash input)", crashNoSocketType, ReasonBadCommand, false},
		{"ready without properties", cat(greeting(), command(cmdReady, nil)), ReasonBadCommand, false},
		{"incompatible socket-type", cat(greeting(), command(cmdReady, props("Socket-Type", "PUB"))),
			ReasonBadHandshake, false},
		{"unknown socket-type", cat(greeting(), command(cmdReady, props("Socket-Type", "FOO"))), ReasonBadCommand, false},
		{"empty socket-type", cat(greeting(), command(cmdReady, props("Socket-Type", ""))), ReasonBadCommand, false},
		{"long socket-type", cat(greeting(), command(cmdReady, props("Socket-Type", "DEALERS"))), ReasonBadCommand, false},
		{"socket-type zmq4 cannot see", cat(greeting(), command(cmdReady, props("SOCKET-TYPE", "DEALER"))), ReasonBadCommand, false},
		{"second socket-type unknown", cat(greeting(), command(cmdReady,
			props("Socket-Type", "DEALER", "Socket-Type", "NOPE"))), ReasonBadCommand, false},
		{"non-ascii property name", cat(greeting(), command(cmdReady,
			props("\xc5\xbfocket-type", "DEALER"))), ReasonBadCommand, false},
		{"huge frame (crash input)", crashHugeFrame, ReasonFrameTooLarge, true},
		{"ready value overruns body", cat(greeting(), frame(flagCommand,
			cat([]byte{5}, []byte("READY"), []byte{1, 'k', 0, 0, 0, 9}, []byte("abc")))), ReasonBadCommand, false},
		{"ready empty property name", cat(greeting(), command(cmdReady, []byte{0, 0, 0, 0, 0})), ReasonBadCommand, false},
		{"command name overruns body", cat(greeting(), frame(flagCommand, []byte{9, 'R', 'E'})), ReasonBadCommand, false},
		{"empty command", cat(greeting(), frame(flagCommand, nil)), ReasonBadCommand, false},
		{"unknown command", cat(hs, command("SUBSCRIBE", nil)), ReasonBadCommand, true},
		{"second ready", cat(hs, ready("DEALER", "y")), ReasonBadCommand, true},
		{"ping too short", cat(hs, command(cmdPing, []byte{0})), ReasonBadCommand, true},
		{"pong too long", cat(hs, command(cmdPong, make([]byte, 17))), ReasonBadCommand, true},
		{"error reason length", cat(hs, command(cmdError, []byte("\x09bye"))), ReasonBadCommand, true},
		{"message before ready", cat(greeting(), frame(0, []byte("hi"))), ReasonBadHandshake, false},
		{"ping before ready", cat(greeting(), command(cmdPing, []byte{0, 0})), ReasonBadHandshake, false},
		{"unknown before ready", cat(greeting(), command("HELLO", nil)), ReasonBadHandshake, false},
		{"frame over limit", cat(hs, frameHeader(0, 1<<10+1)), ReasonFrameTooLarge, true},
		{"command over limit", cat(greeting(), frameHeader(flagCommand|flagLong, 257)), ReasonFrameTooLarge, false},
		{"message over limit", cat(hs, frame(flagMore, make([]byte, 600)), frameHeader(0, 600)), ReasonFrameTooLarge, true},
		{"too many parts", cat(hs, frame(flagMore, nil), frame(flagMore, nil), frame(flagMore, nil), frame(0, nil)),
			ReasonTooManyParts, true},
		{"reserved flag bits", cat(hs, []byte{0x08, 0}), ReasonBadFlags, true},
		{"command with more", cat(hs, frame(flagCommand|flagMore, []byte("\x04PING\x00\x00"))), ReasonBadFlags, true},
		{"command inside message", cat(hs, frame(flagMore, nil), command(cmdPing, []byte{0, 0})), ReasonBadFlags, true},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	splits := map[string]func(int) int{
		"whole":  func(n int) int { return n },
		"bytes":  func(int) int { return 1 },
		"random": func(n int) int { return 1 + rng.IntN(n) },
	}
	for _, tc := range cases {
		for sname, split := range splits {
			p := newParser(testLimits)
			v := feedChunks(p, tc.in, split)
			got := ""
			if v != nil {
				got = v.reason
			}
			if got != tc.want {
				t.Errorf("%s/%s: verdict %q (%v), want %q", tc.name, sname, got, v, tc.want)
			}
			if p.handshakeDone() != tc.ready {
				t.Errorf("%s/%s: handshakeDone %v, want %v", tc.name, sname, p.handshakeDone(), tc.ready)
			}
		}
	}
}

// A READY property value length split across two reads is legal; a READY
// body that ends inside it is not (the crash input).
func TestParserPropertyLengthSplitAcrossReads(t *testing.T) {
	hs := handshake("split")
	// Offset of the first property's value length: greeting, 2-byte
	// header, name length + "READY", name length + "Socket-Type".
	at := greetingLen + 2 + 6 + 12 + 2
	p := newParser(testLimits)
	if v := p.feed(hs[:at]); v != nil {
		t.Fatal(v)
	}
	if v := p.feed(hs[at:]); v != nil || !p.handshakeDone() {
		t.Fatalf("split READY: %v, done=%v", v, p.handshakeDone())
	}
	// The cut is seen at the property name length byte: the body has no
	// room left for name + 4-byte value length. zmq4 never gets the body.
	p = newParser(testLimits)
	nameLenAt := greetingLen + 2 + 6
	for i := range crashCutReady {
		v := p.feed(crashCutReady[i : i+1])
		if i < nameLenAt && v != nil {
			t.Fatalf("byte %d: early %v", i, v)
		}
		if i == nameLenAt {
			if v == nil || v.reason != ReasonBadCommand {
				t.Fatalf("cut READY at byte %d: %v", i, v)
			}
			return
		}
	}
}

func BenchmarkParserMessageFrames(b *testing.B) {
	stream := bytes.Repeat(frame(0, make([]byte, 200)), 1000)
	p := newParser(limits{maxFrame: 1 << 20, maxCommand: 1 << 14, maxParts: 4})
	if v := p.feed(handshake("bench")); v != nil {
		b.Fatal(v)
	}
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		if v := p.feed(stream); v != nil {
			b.Fatal(v)
		}
	}
}
