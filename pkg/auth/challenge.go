package auth

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"go.uber.org/zap"
)

// The data-connection preface (both messages of a side are fixed-size):
//
//	client -> server  hello:  "PDLA" | version 1 | client nonce (32)
//	server -> client  hello:  "PDLA" | version 1 | server nonce (32)
//	client -> server  proof:  HMAC(Kd, "client" label | Nc | Ns)   (32)
//	server -> client  proof:  HMAC(Kd, "server" label | Nc | Ns)   (32)
//
// Kd is the data key derived from the token. The client proves first, so
// the listener, which anyone can reach, computes nothing for a peer that has
// not proven the secret; it proves with the token that verified the client,
// which the client holds. Both nonces are fresh per connection, so a
// recorded proof is useless on another connection, and the direction label
// makes a proof of one side useless as the other's (reflection).
const (
	prefaceMagic   = "PDLA"
	prefaceVersion = 1
	nonceLen       = 32
	helloLen       = len(prefaceMagic) + 1 + nonceLen
	// dataMagic is pkg/transfer's frame magic: a peer that sends it instead
	// of a hello runs without a secret.
	dataMagic = "PDKV"
)

var (
	labelClientProof = []byte("pdlink/v1 data client proof\x00")
	labelServerProof = []byte("pdlink/v1 data server proof\x00")
)

// Data runs the mutual challenge-response on data connections; it
// implements pkg/transfer's Authenticator (set it as SenderConfig.Auth on
// prefill and ReceiverConfig.Auth on decode). Client and Server are safe for
// concurrent use; each runs on the caller's goroutine and starts none that
// outlives it.
type Data struct {
	k *Keyring
}

// Data returns the data-plane authenticator.
func (k *Keyring) Data() *Data { return &Data{k: k} }

// Client proves the secret to the server at the other end of conn and
// checks the server's proof. It returns conn itself. It honours ctx: its
// deadline bounds the preface (the transfer Sender also sets it on conn)
// and cancelling it aborts the preface. On error conn is closed and the
// error carries a Reason (ReasonOf).
func (d *Data) Client(ctx context.Context, conn net.Conn) (net.Conn, error) {
	stop := watch(ctx, conn)
	err := d.client(conn)
	return d.finish(ctx, conn, stop, "client", err)
}

// Server checks the proof of the client at the other end of conn and then
// proves the secret back. It returns conn itself. It honours ctx as Client
// does (the transfer Receiver bounds it with its HandshakeTimeout). On error
// conn is closed and the error carries a Reason (ReasonOf).
func (d *Data) Server(ctx context.Context, conn net.Conn) (net.Conn, error) {
	stop := watch(ctx, conn)
	err := d.server(conn)
	return d.finish(ctx, conn, stop, "server", err)
}

func (d *Data) client(conn net.Conn) error {
	var nc, ns [nonceLen]byte
	_, _ = rand.Read(nc[:]) // never fails (crypto/rand)
	if err := writeAll(conn, hello(nc)); err != nil {
		return err
	}
	if err := readHello(conn, &ns); err != nil {
		return err
	}
	if ns == nc {
		return d.k.ctr.reject(ReasonChallengeProtocol, fmt.Errorf("%w: the server echoed our nonce", ErrChallengeProtocol))
	}
	s := d.k.ring.Load().signing(d.k.now())
	if err := writeAll(conn, s.data.sum(make([]byte, 0, MACLen), labelClientProof, nc[:], ns[:])); err != nil {
		return err
	}
	var got [MACLen]byte
	if _, err := io.ReadFull(conn, got[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isReset(err) {
			return d.k.ctr.reject(ReasonChallengeRefused, fmt.Errorf("%w (token fingerprint %s): does it hold the same token?", ErrChallengeRefused, s.fp))
		}
		return err
	}
	var want [MACLen]byte
	if !hmac.Equal(s.data.sum(want[:0], labelServerProof, nc[:], ns[:]), got[:]) {
		return d.k.ctr.reject(ReasonChallengeFailed, fmt.Errorf("%w: the server's proof does not verify", ErrChallengeFailed))
	}
	d.k.ctr.handshakes.Add(1)
	return nil
}

func (d *Data) server(conn net.Conn) error {
	var nc, ns [nonceLen]byte
	if err := readHello(conn, &nc); err != nil {
		return err
	}
	_, _ = rand.Read(ns[:])
	if err := writeAll(conn, hello(ns)); err != nil {
		return err
	}
	var got [MACLen]byte
	if _, err := io.ReadFull(conn, got[:]); err != nil {
		return err
	}
	var buf [MACLen]byte
	s, current, retired := d.k.ring.Load().find(d.k.now(), func(s *secret) bool {
		return hmac.Equal(s.data.sum(buf[:0], labelClientProof, nc[:], ns[:]), got[:])
	})
	switch {
	case s == nil && retired:
		return d.k.ctr.reject(ReasonChallengeRetired, fmt.Errorf("%w: the client proves a token this daemon no longer accepts (overlap window ended)", ErrTokenRetired))
	case s == nil:
		return d.k.ctr.reject(ReasonChallengeFailed, fmt.Errorf("%w: the client's proof matches no accepted token", ErrChallengeFailed))
	}
	if err := writeAll(conn, s.data.sum(make([]byte, 0, MACLen), labelServerProof, nc[:], ns[:])); err != nil {
		return err
	}
	d.k.ctr.handshakes.Add(1)
	if !current {
		d.k.ctr.handshakesOther.Add(1)
	}
	return nil
}

// finish turns the outcome of one side into the Authenticator result:
// classifies and counts an I/O error, logs a refusal (rate limited), closes
// conn on error.
func (d *Data) finish(ctx context.Context, conn net.Conn, stop func() bool, role string, err error) (net.Conn, error) {
	if !stop() && err == nil {
		// ctx ended as we finished: its deadline may already be on conn.
		err = ctx.Err()
	}
	if err == nil {
		return conn, nil
	}
	if _, ok := ReasonOf(err); !ok {
		err = d.classify(ctx, err)
	}
	r, _ := ReasonOf(err)
	if n, ok := d.k.lim.Allow(r); ok {
		d.k.log.Warn("data connection authentication failed", zap.String("role", role), zap.Stringer("reason", r),
			zap.Stringer("remote", conn.RemoteAddr()), zap.Error(err), zap.Uint64("suppressed", n))
	}
	_ = conn.Close()
	return nil, err
}

// classify counts an I/O error of the preface under its reason.
func (d *Data) classify(ctx context.Context, err error) error {
	var pe *protocolError
	if errors.As(err, &pe) {
		return d.k.ctr.reject(ReasonChallengeProtocol, fmt.Errorf("%w: %s", ErrChallengeProtocol, pe.msg))
	}
	var ne net.Error
	timeout := errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
	if timeout && !errors.Is(ctx.Err(), context.Canceled) {
		return d.k.ctr.reject(ReasonChallengeTimeout, fmt.Errorf("%w: %w", ErrChallengeTimeout, err))
	}
	return d.k.ctr.reject(ReasonChallengeIO, fmt.Errorf("auth: preface: %w", err))
}

// protocolError marks a hello that is not ours.
type protocolError struct{ msg string }

func (e *protocolError) Error() string { return e.msg }

func hello(nonce [nonceLen]byte) []byte {
	b := make([]byte, 0, helloLen)
	b = append(b, prefaceMagic...)
	b = append(b, prefaceVersion)
	return append(b, nonce[:]...)
}

// readHello reads the peer's hello into nonce.
func readHello(conn net.Conn, nonce *[nonceLen]byte) error {
	var b [helloLen]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		return err
	}
	switch {
	case string(b[:len(prefaceMagic)]) == dataMagic:
		return &protocolError{"the peer sent data frames without the auth preface: it runs without --auth-token-file"}
	case string(b[:len(prefaceMagic)]) != prefaceMagic:
		return &protocolError{fmt.Sprintf("the peer did not open with the auth preface (got % x)", b[:len(prefaceMagic)])}
	case b[len(prefaceMagic)] != prefaceVersion:
		return &protocolError{fmt.Sprintf("the peer speaks auth preface version %d, we speak %d", b[len(prefaceMagic)], prefaceVersion)}
	}
	copy(nonce[:], b[len(prefaceMagic)+1:])
	return nil
}

func writeAll(conn net.Conn, b []byte) error {
	_, err := conn.Write(b)
	return err
}

// watch applies ctx to conn for the preface: ctx's deadline as conn's, and
// an immediate deadline when ctx is cancelled. stop reports false if ctx
// ended meanwhile.
func watch(ctx context.Context, conn net.Conn) (stop func() bool) {
	if d, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(d)
	}
	return context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
}

func isReset(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrClosedPipe) || errors.Is(err, syscall.ECONNRESET)
}
