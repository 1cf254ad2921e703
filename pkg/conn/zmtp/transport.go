package zmtp

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	ztransport "github.com/go-zeromq/zmq4/transport"
	"go.uber.org/zap"

	"github.com/pdlink/pdlink/pkg/conn"
)

// Scheme is the zmq4 transport name under which the guarded TCP transport
// is registered. Public addresses stay "tcp://host:port"; the Transport
// rewrites them to Scheme+"://host:port" for zmq4.
const Scheme = "pdtcp"

var registerOnce sync.Once

// register installs the guarded transport in zmq4's global registry. The
// transport finds its guard in the socket's context, so one registration
// serves every Transport in the process.
func register() {
	registerOnce.Do(func() {
		if err := zmq4.RegisterTransport(Scheme, guardedTransport{}); err != nil {
			panic(fmt.Sprintf("zmtp: register %s: %v", Scheme, err))
		}
	})
}

type guardKey struct{}

func guardFrom(ctx context.Context) *guard {
	g, _ := ctx.Value(guardKey{}).(*guard)
	return g
}

// guardedTransport is the zmq4 transport.Transport behind Scheme.
type guardedTransport struct{}

func (guardedTransport) Dial(ctx context.Context, d ztransport.Dialer, addr string) (net.Conn, error) {
	g := guardFrom(ctx)
	if g == nil {
		return nil, ErrNoGuard
	}
	return g.dialGuarded(ctx, d, addr)
}

func (guardedTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	g := guardFrom(ctx)
	if g == nil {
		return nil, ErrNoGuard
	}
	return g.listenGuarded(ctx, addr)
}

func (guardedTransport) Addr(ep string) (string, error) {
	return ztransport.New("tcp").Addr(ep)
}

// Transport is the ZeroMQ conn.Transport. Create it with New; it holds no
// goroutine of its own, only the counters and settings its sockets share.
type Transport struct {
	opts  Options
	log   *zap.Logger
	ctr   *counters
	guard *guard
	base  context.Context // carries the guard to the registered transport

	// testHookRecv, if set, runs in every socket reader for each message
	// (tests use it to inject a panic).
	testHookRecv atomic.Pointer[func()]
}

var _ conn.Transport = (*Transport)(nil)

// New returns a Transport with opts (zero fields take their defaults).
func New(opts Options) *Transport {
	register()
	o := opts.withDefaults()
	ctr := newCounters()
	g := newGuard(o, ctr)
	return &Transport{
		opts:  o,
		log:   o.Logger,
		ctr:   ctr,
		guard: g,
		base:  context.WithValue(context.Background(), guardKey{}, g),
	}
}

// Stats returns a snapshot of the counters.
func (t *Transport) Stats() Stats { return t.ctr.snapshot() }

// Rejected returns how many connections the guard closed for reason.
func (t *Transport) Rejected(reason string) uint64 {
	if c, ok := t.ctr.rejected[reason]; ok {
		return c.Load()
	}
	return 0
}

// Listen binds a ROUTER socket on addr ("tcp://host:port", port 0 picks
// one) behind the guard. ctx bounds nothing after Listen returns: the
// Listener lives until Close.
func (t *Transport) Listen(ctx context.Context, addr string) (conn.Listener, error) {
	ep, err := rewrite(addr)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sock, bound, err := t.bindRouter(ep)
	if err != nil {
		return nil, err
	}
	return t.startListener(sock, bound), nil
}

// Dial returns a Conn to the Listener at addr. It does not wait for the
// peer: the Conn connects (and reconnects) in the background.
func (t *Transport) Dial(ctx context.Context, addr string) (conn.Conn, error) {
	ep, err := rewrite(addr)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return t.startDialer(ep), nil
}

// rewrite maps "tcp://host:port" to the guarded scheme.
func rewrite(addr string) (string, error) {
	rest, ok := strings.CutPrefix(addr, "tcp://")
	if !ok {
		return "", fmt.Errorf("%w: %q", ErrBadAddress, addr)
	}
	if _, _, err := net.SplitHostPort(rest); err != nil {
		return "", fmt.Errorf("%w: %q: %v", ErrBadAddress, addr, err)
	}
	return Scheme + "://" + rest, nil
}

var discard = log.New(io.Discard, "", 0)

// sockOpts are the options of every socket. Never WithAutomaticReconnect:
// the Conn owns its reconnect loop.
func (t *Transport) sockOpts(extra ...zmq4.Option) []zmq4.Option {
	return append([]zmq4.Option{
		zmq4.WithLogger(discard),
		zmq4.WithDialerMaxRetries(0),
		zmq4.WithDialerTimeout(t.opts.DialTimeout),
		// Bounds only zmq4's wait for a first connection; writes are
		// bounded by the guard's write deadline.
		zmq4.WithTimeout(250 * time.Millisecond),
	}, extra...)
}

// bindRouter creates and binds a ROUTER; bound is the public address with
// the real port.
func (t *Transport) bindRouter(ep string) (zmq4.Socket, string, error) {
	sock := zmq4.NewRouter(t.base, t.sockOpts()...)
	if err := sock.Listen(ep); err != nil {
		_ = sock.Close()
		return nil, "", err
	}
	return sock, "tcp://" + sock.Addr().String(), nil
}

func newIdentity() string {
	var b [12]byte
	_, _ = crand.Read(b[:])
	return "pd-" + hex.EncodeToString(b[:])
}

// backoff returns the wait before attempt (1-based): d doubles from
// ReconnectMin to ReconnectMax and the wait is drawn in [d/2, d].
func (t *Transport) backoff(attempt int) time.Duration {
	d := t.opts.ReconnectMin
	for i := 1; i < attempt && d < t.opts.ReconnectMax; i++ {
		d *= 2
	}
	d = min(d, t.opts.ReconnectMax)
	return d/2 + rand.N(d/2+1)
}

// drain empties zmq4's receive queue of a closed socket so that no zmq4
// reader goroutine stays blocked on it. On a closed socket Recv never
// blocks; it picks at random between "closed" and a queued message, so a
// few dozen calls empty the 10-slot queue with overwhelming probability.
func drain(sock zmq4.Socket) {
	for range 64 {
		_, _ = sock.Recv()
	}
}
