package zmtp

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/pdlink/pdlink/pkg/conn"
)

// hostileSetup is a guarded Listener with one legitimate Conn already
// exchanging frames.
func hostileSetup(t *testing.T, mod func(*Options)) (*Transport, conn.Listener, conn.Conn) {
	t.Helper()
	tr := testTransport(t, mod)
	l := listen(t, tr)
	c := dial(t, tr, l.Addr())
	ping(t, l, c, 5*time.Second)
	return tr, l, c
}

func hostAddr(l conn.Listener) string { return l.Addr()[len("tcp://"):] }

// waitCount polls f until it reaches want (bounded).
func waitCount(t *testing.T, what string, f func() uint64, want uint64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for f() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s = %d, want >= %d", what, f(), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// afterHostile checks the guard counted reason once, the peer was closed,
// and the legitimate Conn (and a new one) still exchange frames.
func afterHostile(t *testing.T, tr *Transport, l conn.Listener, c conn.Conn, p *rawPeer, reason string) {
	t.Helper()
	waitCount(t, reason, func() uint64 { return tr.Rejected(reason) }, 1)
	if !p.closedByServer(2 * time.Second) {
		t.Fatalf("hostile peer not closed after %s", reason)
	}
	ping(t, l, c, 5*time.Second)
	ping(t, l, dial(t, tr, l.Addr()), 5*time.Second)
}

// (a) The frame that makes zmq4 call make([]byte, 2^50) never reaches it:
// sent after zmq4 took over the connection (the server's READY arrived).
func TestGuardRejectsHugeFrameAfterHandshake_R12(t *testing.T) {
	tr, l, c := hostileSetup(t, nil)
	p := dialRaw(t, hostAddr(l))
	if _, err := p.Write(handshake("huge")); err != nil {
		t.Fatal(err)
	}
	// Greeting (64) + zmq4's READY: the library owns the connection now.
	waitCount(t, "bytes from server", func() uint64 { return uint64(p.received()) }, greetingLen+20)
	if _, err := p.Write(frameHeader(flagLong, 1<<50)); err != nil {
		t.Fatal(err)
	}
	afterHostile(t, tr, l, c, p, ReasonFrameTooLarge)
}

// (a') The same bytes in one write are caught during the pre-handshake.
func TestGuardRejectsHugeFrameInOneWrite_R12(t *testing.T) {
	tr, l, c := hostileSetup(t, nil)
	p := dialRaw(t, hostAddr(l))
	if _, err := p.Write(crashHugeFrame); err != nil {
		t.Fatal(err)
	}
	afterHostile(t, tr, l, c, p, ReasonFrameTooLarge)
}

// (b) A READY whose property value length is cut after 2 of its 4 bytes,
// sent in two TCP writes split inside that length.
func TestGuardRejectsCutReadyProperty_R12(t *testing.T) {
	tr, l, c := hostileSetup(t, nil)
	p := dialRaw(t, hostAddr(l))
	cut := len(crashCutReady) - 1
	if _, err := p.Write(crashCutReady[:cut]); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	if _, err := p.Write(crashCutReady[cut:]); err != nil {
		t.Fatal(err)
	}
	afterHostile(t, tr, l, c, p, ReasonBadCommand)
}

// (b') A well-formed READY without Socket-Type (zmq4 panics on the
// unknown peer type; found by FuzzGuard).
func TestGuardRejectsReadyWithoutSocketType_R12(t *testing.T) {
	tr, l, c := hostileSetup(t, nil)
	p := dialRaw(t, hostAddr(l))
	if _, err := p.Write(crashNoSocketType); err != nil {
		t.Fatal(err)
	}
	afterHostile(t, tr, l, c, p, ReasonBadCommand)
}

// A known but incompatible peer type: zmq4 would fail its handshake and
// leave the connection open (an fd per attempt); the guard closes it.
func TestGuardRejectsIncompatibleSocketType(t *testing.T) {
	tr, l, c := hostileSetup(t, nil)
	p := dialRaw(t, hostAddr(l))
	if _, err := p.Write(cat(greeting(), ready("PUB", "pub"))); err != nil {
		t.Fatal(err)
	}
	afterHostile(t, tr, l, c, p, ReasonBadHandshake)
}

// (c) A wrong signature is rejected at its first byte.
func TestGuardRejectsWrongSignature(t *testing.T) {
	tr, l, c := hostileSetup(t, nil)
	p := dialRaw(t, hostAddr(l))
	if _, err := p.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")); err != nil {
		t.Fatal(err)
	}
	afterHostile(t, tr, l, c, p, ReasonBadGreeting)
}

// (d) Random bytes, raw or after a valid greeting: the process survives,
// the guard counts exactly the verdict an independent parser run gives,
// and the legitimate Conn keeps working.
func TestGuardSurvivesRandomBytes(t *testing.T) {
	tr, l, c := hostileSetup(t, nil)
	rapid.Check(t, func(rt *rapid.T) {
		junk := rapid.SliceOfN(rapid.Byte(), 1, 256).Draw(rt, "junk")
		if rapid.Bool().Draw(rt, "greeting") {
			junk = cat(greeting(), junk)
		}
		want := ReasonHandshakeIncomplete
		lim := tr.guard.lim
		lim.peerType = "DEALER"
		pr := newParser(lim)
		if v := pr.feed(junk); v != nil {
			want = v.reason
		} else if pr.handshakeDone() {
			want = "" // valid handshake: zmq4 takes it and sees EOF
		}
		before := tr.Stats().Rejected
		p := dialRaw(t, hostAddr(l))
		if _, err := p.Write(junk); err != nil {
			rt.Fatal(err)
		}
		if want == ReasonHandshakeIncomplete {
			_ = p.Conn.(interface{ CloseWrite() error }).CloseWrite()
		}
		if want != "" {
			deadline := time.Now().Add(5 * time.Second)
			for tr.Rejected(want) == before[want] {
				if time.Now().After(deadline) {
					rt.Fatalf("reason %s not counted for %x", want, junk)
				}
				time.Sleep(time.Millisecond)
			}
		}
		p.close()
	})
	ping(t, l, c, 5*time.Second)
	t.Logf("rejections: %v", tr.Stats().Rejected)
}

// (e) A flood of connections that send a greeting and stall: at most
// MaxPendingHandshakes hold a slot, each for HandshakeTimeout; the rest
// are refused at once. The established Conn never stops, and a new Conn
// gets in within a bound.
func TestGuardSurvivesStalledHandshakeFlood(t *testing.T) {
	const pending, flood = 8, 40
	tr, l, c := hostileSetup(t, func(o *Options) {
		o.MaxPendingHandshakes = pending
		o.HandshakeTimeout = 300 * time.Millisecond
	})
	peers := make([]*rawPeer, flood)
	for i := range peers {
		peers[i] = dialRaw(t, hostAddr(l))
		if _, err := peers[i].Write(greeting()); err != nil {
			t.Fatal(err)
		}
	}
	ping(t, l, c, 5*time.Second)
	ping(t, l, dial(t, tr, l.Addr()), 5*time.Second)
	total := func() uint64 {
		return tr.Rejected(ReasonHandshakeOverload) + tr.Rejected(ReasonHandshakeTimeout)
	}
	waitCount(t, "overload+timeout", total, flood)
	if tr.Rejected(ReasonHandshakeTimeout) == 0 || tr.Rejected(ReasonHandshakeOverload) == 0 {
		t.Fatalf("want both timeouts and overloads, got %v", tr.Stats().Rejected)
	}
	for i, p := range peers {
		if !p.closedByServer(2 * time.Second) {
			t.Fatalf("stalled peer %d still open", i)
		}
	}
}

func TestGuardAllowListRefusesOtherNetworks(t *testing.T) {
	tr := testTransport(t, func(o *Options) {
		o.AllowedNetworks = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	})
	l := listen(t, tr)
	p := dialRaw(t, hostAddr(l))
	_, _ = p.Write(handshake("outsider"))
	waitCount(t, ReasonPeerRefused, func() uint64 { return tr.Rejected(ReasonPeerRefused) }, 1)
	if !p.closedByServer(2 * time.Second) {
		t.Fatal("refused peer still open")
	}

	ok := testTransport(t, func(o *Options) {
		o.AllowedNetworks = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}
	})
	l2 := listen(t, ok)
	ping(t, l2, dial(t, ok, l2.Addr()), 5*time.Second)
}

// Frames that pass the guard but break the frame contract are dropped and
// counted by Recv, and the connection keeps working.
func TestRecvDropsOversizeAndMultipartFrames(t *testing.T) {
	tr, l, c := hostileSetup(t, nil)
	p := dialRaw(t, hostAddr(l))
	big := bytes.Repeat([]byte{'x'}, conn.MaxFrameSize+1)
	msgs := cat(handshake("bad"),
		frame(0, big),
		frame(flagMore, []byte("part1")), frame(0, []byte("part2")),
		command(cmdPing, []byte{0, 0}),
		frame(0, []byte("fine")))
	if _, err := p.Write(msgs); err != nil {
		t.Fatal(err)
	}
	drops := func(r string) func() uint64 { return func() uint64 { return tr.Stats().Dropped[r] } }
	waitCount(t, DropOversize, drops(DropOversize), 1)
	waitCount(t, DropBadParts, drops(DropBadParts), 1)
	waitCount(t, DropCommand, drops(DropCommand), 1)
	deadline := time.Now().Add(5 * time.Second)
	for {
		route, f, err := recvWithin(l, time.Second)
		if err != nil || time.Now().After(deadline) {
			t.Fatalf("valid frame after bad ones not received: %v", err)
		}
		if string(f) == "fine" {
			if route != "bad" {
				t.Fatalf("route %q, want the peer's identity", route)
			}
			break
		}
	}
	if p.closedByServer(50 * time.Millisecond) {
		t.Fatal("peer closed for frames the guard allows")
	}
	ping(t, l, c, 5*time.Second)
}

// rawServer accepts TCP connections and answers each with script.
func rawServer(t *testing.T, script []byte) (addr string, accepted func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			_, _ = c.Write(script)
			go func() { _, _ = io.Copy(io.Discard, c); _ = c.Close() }()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return "tcp://" + ln.Addr().String(), func() int { return int(n.Load()) }
}

// A Conn dialed to a hostile (or spoofed) listener is guarded the same
// way: each crash input is rejected, the Conn keeps reconnecting, the
// process lives.
func TestConnGuardsAgainstHostileListener_R12(t *testing.T) {
	routerHS := cat(greeting(), ready("ROUTER", ""))
	for name, tc := range map[string]struct {
		script []byte
		reason string
	}{
		"huge_frame":     {cat(routerHS, frameHeader(flagLong, 1<<50)), ReasonFrameTooLarge},
		"cut_ready":      {crashCutReady, ReasonBadCommand},
		"no_socket_type": {crashNoSocketType, ReasonBadCommand},
		"bad_greeting":   {[]byte("SSH-2.0-OpenSSH_9.6\r\n"), ReasonBadGreeting},
	} {
		t.Run(name, func(t *testing.T) {
			tr := testTransport(t, nil)
			addr, accepted := rawServer(t, tc.script)
			c := dial(t, tr, addr)
			waitCount(t, tc.reason, func() uint64 { return tr.Rejected(tc.reason) }, 2)
			if accepted() < 2 {
				t.Fatalf("conn did not reconnect after rejection (accepted %d)", accepted())
			}
			_ = c.Close()
		})
	}
}

// A peer that completes the handshake and then stops reading: the first
// write that cannot complete within WriteTimeout closes it (write_stall),
// and the Listener goes on serving the others.
func TestGuardClosesPeerThatStopsReading(t *testing.T) {
	tr, l, c := hostileSetup(t, func(o *Options) { o.WriteTimeout = 200 * time.Millisecond })
	raw, err := net.Dial("tcp", hostAddr(l))
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Write(handshake("slow")); err != nil {
		t.Fatal(err)
	}
	// Read the server's greeting and READY, then never read again.
	_ = raw.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadAtLeast(raw, make([]byte, 256), greetingLen+20); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	big := make([]byte, conn.MaxFrameSize)
	for tr.Rejected(ReasonWriteStall) == 0 {
		if err := l.Send(ctx, "slow", big); err != nil {
			t.Fatalf("no write stall detected: %v", err)
		}
	}
	ping(t, l, c, 5*time.Second)
}

// A listener that accepts and says nothing: the Conn's handshake is
// bounded, counted, and retried.
func TestConnBoundsSilentListenerHandshake(t *testing.T) {
	tr := testTransport(t, func(o *Options) { o.HandshakeTimeout = 100 * time.Millisecond })
	addr, accepted := rawServer(t, nil)
	c := dial(t, tr, addr)
	waitCount(t, ReasonHandshakeTimeout, func() uint64 { return tr.Rejected(ReasonHandshakeTimeout) }, 2)
	if accepted() < 2 {
		t.Fatalf("accepted %d, want retries", accepted())
	}
	_ = c.Close()
}
