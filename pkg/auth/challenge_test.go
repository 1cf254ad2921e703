package auth

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// handshake runs Client on one end and Server on the other end of a pair of
// connections and returns both errors.
func handshake(t *testing.T, client, server *Keyring, cc, sc net.Conn, timeout time.Duration) (cerr, serr error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := server.Data().Server(ctx, sc)
		done <- err
	}()
	_, cerr = client.Data().Client(ctx, cc)
	serr = <-done
	return cerr, serr
}

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-acc
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func pipePair(t *testing.T) (net.Conn, net.Conn) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

var transports = []struct {
	name string
	pair func(*testing.T) (net.Conn, net.Conn)
}{{"pipe", pipePair}, {"tcp", tcpPair}}

// assertClosed checks that c was closed by the authenticator.
func assertClosed(t *testing.T, c net.Conn) {
	t.Helper()
	if _, err := c.Write([]byte{0}); !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.ErrClosedPipe) {
		t.Fatalf("conn still open after a failed preface (write err %v)", err)
	}
}

func TestChallengeSucceedsBothWaysAndLeavesTheConnUsable(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			clk := newFakeClock()
			ck, sk := mustNew(t, clk, 0, 0, tokOld), mustNew(t, clk, 0, 0, tokOld)
			cc, sc := tr.pair(t)
			cerr, serr := handshake(t, ck, sk, cc, sc, 5*time.Second)
			if cerr != nil || serr != nil {
				t.Fatalf("client %v, server %v", cerr, serr)
			}
			// The callers reset the deadline; the conn carries data afterwards.
			_ = cc.SetDeadline(time.Time{})
			_ = sc.SetDeadline(time.Time{})
			go func() { _, _ = cc.Write([]byte("PDKV")) }()
			b := make([]byte, 4)
			if _, err := io.ReadFull(sc, b); err != nil || string(b) != "PDKV" {
				t.Fatalf("after preface: %q %v", b, err)
			}
			if ck.Stats().Handshakes != 1 || sk.Stats().Handshakes != 1 || sk.Stats().HandshakesOther != 0 {
				t.Fatalf("stats client %+v server %+v", ck.Stats(), sk.Stats())
			}
		})
	}
}

func TestChallengeWithTheWrongTokenFailsOnBothSidesAndCloses(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			clk := newFakeClock()
			ck, sk := mustNew(t, clk, 0, 0, tokAlt), mustNew(t, clk, 0, 0, tokOld)
			cc, sc := tr.pair(t)
			cerr, serr := handshake(t, ck, sk, cc, sc, 5*time.Second)
			wantReason(t, serr, ReasonChallengeFailed, ErrChallengeFailed)
			wantReason(t, cerr, ReasonChallengeRefused, ErrChallengeRefused)
			assertClosed(t, cc)
			assertClosed(t, sc)
			if sk.Stats().Rejected(ReasonChallengeFailed) != 1 || ck.Stats().Rejected(ReasonChallengeRefused) != 1 {
				t.Fatalf("stats client %+v server %+v", ck.Stats(), sk.Stats())
			}
		})
	}
}

// rawPeer speaks the preface by hand.
type rawPeer struct {
	t *testing.T
	c net.Conn
}

func (p rawPeer) write(b []byte) {
	p.t.Helper()
	if _, err := p.c.Write(b); err != nil {
		p.t.Fatal(err)
	}
}

func (p rawPeer) read(n int) []byte {
	p.t.Helper()
	b := make([]byte, n)
	if _, err := io.ReadFull(p.c, b); err != nil {
		p.t.Fatal(err)
	}
	return b
}

// serveOnce runs Server on the far end of a new pipe and returns the near
// end and the server's result.
func serveOnce(t *testing.T, k *Keyring, timeout time.Duration) (rawPeer, <-chan error) {
	cc, sc := pipePair(t)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		_, err := k.Data().Server(ctx, sc)
		done <- err
	}()
	return rawPeer{t, cc}, done
}

// tapConn records what is written to it.
type tapConn struct {
	net.Conn
	sent []byte
}

func (c *tapConn) Write(b []byte) (int, error) {
	c.sent = append(c.sent, b...)
	return c.Conn.Write(b)
}

// TestAReplayedClientTranscriptFails: an eavesdropper who recorded a whole
// successful preface replays the client's messages; the server's fresh
// nonce makes the recorded proof worthless.
func TestAReplayedClientTranscriptFails(t *testing.T) {
	clk := newFakeClock()
	k := mustNew(t, clk, 0, 0, tokOld)
	cc, sc := pipePair(t)
	tap := &tapConn{Conn: cc}
	if cerr, serr := handshake(t, k, k, tap, sc, 5*time.Second); cerr != nil || serr != nil {
		t.Fatalf("recording: client %v server %v", cerr, serr)
	}
	if len(tap.sent) != helloLen+MACLen {
		t.Fatalf("recorded %d bytes", len(tap.sent))
	}
	p, done := serveOnce(t, k, 5*time.Second)
	p.write(tap.sent[:helloLen])
	p.read(helloLen)
	p.write(tap.sent[helloLen:])
	wantReason(t, <-done, ReasonChallengeFailed, ErrChallengeFailed)
}

// TestAServerReflectingTheClientsNonceOrProofFails: a fake listener that
// echoes the client's own challenge, or its own proof, back.
func TestAServerReflectingTheClientsNonceOrProofFails(t *testing.T) {
	clk := newFakeClock()
	k := mustNew(t, clk, 0, 0, tokOld)
	run := func(fake func(p rawPeer)) error {
		cc, sc := pipePair(t)
		go fake(rawPeer{t, sc})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := k.Data().Client(ctx, cc)
		return err
	}
	// Echo the hello (our nonce as its own).
	wantReason(t, run(func(p rawPeer) {
		h := p.read(helloLen)
		_, _ = p.c.Write(h)
	}), ReasonChallengeProtocol, ErrChallengeProtocol)
	// Fresh nonce, then our own proof back as its proof.
	wantReason(t, run(func(p rawPeer) {
		p.read(helloLen)
		var ns [nonceLen]byte
		ns[0] = 1
		_, _ = p.c.Write(hello(ns))
		proof := make([]byte, MACLen)
		if _, err := io.ReadFull(p.c, proof); err != nil {
			return
		}
		_, _ = p.c.Write(proof)
	}), ReasonChallengeFailed, ErrChallengeFailed)
}

// TestAClientReflectingTheServersNonceFails: a client without the token
// that sends back what the server sent it.
func TestAClientReflectingTheServersNonceFails(t *testing.T) {
	clk := newFakeClock()
	k := mustNew(t, clk, 0, 0, tokOld)
	// Learn a server nonce on one connection...
	p1, done1 := serveOnce(t, k, 5*time.Second)
	var nc [nonceLen]byte
	p1.write(hello(nc))
	h1 := p1.read(helloLen)
	// ...open a second with that nonce as ours, then send the first
	// server's hello tail, and the second's, as proofs.
	p2, done2 := serveOnce(t, k, 5*time.Second)
	p2.write(h1)
	h2 := p2.read(helloLen)
	p2.write(h2[len(h2)-MACLen:])
	p1.write(h1[len(h1)-MACLen:])
	wantReason(t, <-done2, ReasonChallengeFailed, ErrChallengeFailed)
	wantReason(t, <-done1, ReasonChallengeFailed, ErrChallengeFailed)
	if got := k.Stats().Rejected(ReasonChallengeFailed); got != 2 {
		t.Fatalf("counted %d", got)
	}
}

func TestASilentPeerHitsTheDeadline(t *testing.T) {
	clk := newFakeClock()
	k := mustNew(t, clk, 0, 0, tokOld)
	for _, tr := range transports {
		t.Run(tr.name+"/silent client", func(t *testing.T) {
			_, sc := tr.pair(t)
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := k.Data().Server(ctx, sc)
			wantReason(t, err, ReasonChallengeTimeout, ErrChallengeTimeout)
			if el := time.Since(start); el > 2*time.Second {
				t.Fatalf("took %v", el)
			}
			assertClosed(t, sc)
		})
		t.Run(tr.name+"/silent server", func(t *testing.T) {
			cc, sc := tr.pair(t)
			go func() { _, _ = io.Copy(io.Discard, sc) }() // reads, never answers
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			_, err := k.Data().Client(ctx, cc)
			wantReason(t, err, ReasonChallengeTimeout, ErrChallengeTimeout)
		})
	}
	t.Run("deadline set on the conn by the caller", func(t *testing.T) {
		_, sc := tcpPair(t)
		_ = sc.SetDeadline(time.Now().Add(100 * time.Millisecond))
		_, err := k.Data().Server(context.Background(), sc)
		wantReason(t, err, ReasonChallengeTimeout, ErrChallengeTimeout)
	})
}

func TestCancellingTheContextAbortsThePreface(t *testing.T) {
	k := mustNew(t, newFakeClock(), 0, 0, tokOld)
	cc, _ := tcpPair(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, err := k.Data().Client(ctx, cc)
	if r, ok := ReasonOf(err); !ok || r != ReasonChallengeIO || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("err = %v (reason %v)", err, r)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("took %v", el)
	}
}

func TestAPeerWithoutAuthIsNamed(t *testing.T) {
	k := mustNew(t, newFakeClock(), 0, 0, tokOld)
	p, done := serveOnce(t, k, 5*time.Second)
	hdr := make([]byte, 64) // a transfer frame header
	copy(hdr, dataMagic)
	go func() { _, _ = p.c.Write(hdr) }()
	err := <-done
	wantReason(t, err, ReasonChallengeProtocol, ErrChallengeProtocol)
	if want := "runs without --auth-token-file"; !strings.Contains(err.Error(), want) {
		t.Fatalf("message %q does not say %q", err, want)
	}
	p2, done2 := serveOnce(t, k, 5*time.Second)
	bad := hello([nonceLen]byte{})
	bad[len(prefaceMagic)] = 9
	p2.write(bad)
	wantReason(t, <-done2, ReasonChallengeProtocol, ErrChallengeProtocol)
}

// TestChallengeDuringRotation: a server that accepts the old and the new
// token proves with the one the client used.
func TestChallengeDuringRotation(t *testing.T) {
	clk := newFakeClock()
	srv := mustNew(t, clk, 5*time.Minute, 0, tokOld)
	_, _ = srv.Rotate(tokNew)
	for _, ct := range [][]byte{tokOld, tokNew} {
		cc, sc := pipePair(t)
		if cerr, serr := handshake(t, mustNew(t, clk, 0, 0, ct), srv, cc, sc, 5*time.Second); cerr != nil || serr != nil {
			t.Fatalf("client %v server %v", cerr, serr)
		}
	}
	if s := srv.Stats(); s.Handshakes != 2 || s.HandshakesOther != 1 {
		t.Fatalf("stats %+v", s)
	}
	clk.Advance(5 * time.Minute)
	cc, sc := pipePair(t)
	cerr, serr := handshake(t, mustNew(t, clk, 0, 0, tokOld), srv, cc, sc, 5*time.Second)
	wantReason(t, serr, ReasonChallengeRetired, ErrTokenRetired)
	wantReason(t, cerr, ReasonChallengeRefused, ErrChallengeRefused)
}
