package zmtp

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// guard holds what the guarded connections share: limits, the allow-list,
// the counters and the (sampled) logger for hostile input.
type guard struct {
	lim          limits
	allow        []netip.Prefix
	hsTimeout    time.Duration
	maxPending   int
	writeTimeout time.Duration
	ctr          *counters
	onReject     func(string)
	log          *zap.Logger // sampled: hostile peers cannot flood the log
}

func newGuard(o Options, ctr *counters) *guard {
	sampled := o.Logger.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		// First 5 entries per message per second, then none.
		return zapcore.NewSamplerWithOptions(c, time.Second, 5, 0)
	}))
	return &guard{
		lim:          limits{maxFrame: o.MaxWireFrame, maxCommand: o.MaxCommand, maxParts: o.MaxParts},
		allow:        o.AllowedNetworks,
		hsTimeout:    o.HandshakeTimeout,
		maxPending:   o.MaxPendingHandshakes,
		writeTimeout: o.WriteTimeout,
		ctr:          ctr,
		onReject:     o.OnReject,
		log:          sampled,
	}
}

// reject counts and logs one refused connection.
func (g *guard) reject(reason string, peer net.Addr, detail string) {
	g.ctr.rejected[reason].Add(1)
	if g.onReject != nil {
		g.onReject(reason)
	}
	g.log.Warn("peer rejected", zap.String("reason", reason),
		zap.Stringer("peer", peer), zap.String("detail", detail))
}

func (g *guard) allowed(a net.Addr) bool {
	if len(g.allow) == 0 {
		return true
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return false
	}
	ip := ap.Addr().Unmap()
	for _, p := range g.allow {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// guardConn is a TCP connection whose every received byte passes the
// parser before zmq4 sees it. Read is called by one zmq4 goroutine at a
// time (handshake, then the socket's reader); Write by zmq4's writers.
type guardConn struct {
	net.Conn
	g *guard
	p *parser

	// Read side, owned by the single reader.
	pend          []byte // validated bytes not yet returned (handshake replay, buffer)
	buf           []byte // read buffer, allocated on first small read
	readErr       error  // sticky: a violation, or an error held back behind pend
	clearDeadline bool   // the handshake read deadline is still set

	wmu     sync.Mutex
	swallow int // bytes of zmq4's own greeting still to drop (server side)

	closeOnce sync.Once
	onClose   func()
}

// newGuardConn wraps c; peerType is the Socket-Type the peer must have.
func newGuardConn(g *guard, c net.Conn, peerType string) *guardConn {
	lim := g.lim
	lim.peerType = peerType
	return &guardConn{Conn: c, g: g, p: newParser(lim)}
}

// readBufSize is the guardConn read buffer. zmq4 reads a frame as a
// 2-byte header then the body; buffering turns those into one syscall.
const readBufSize = 16 << 10

// Read returns validated bytes only. On the first violation it closes the
// connection, counts the reason and returns a *violation (a net.Error) so
// zmq4 drops the connection.
func (c *guardConn) Read(b []byte) (int, error) {
	if len(c.pend) > 0 {
		n := copy(b, c.pend)
		c.pend = c.pend[n:]
		return n, nil
	}
	if c.readErr != nil {
		return 0, c.readErr
	}
	dst := b
	if len(b) < readBufSize {
		if c.buf == nil {
			c.buf = make([]byte, readBufSize)
		}
		dst = c.buf
	}
	n, err := c.Conn.Read(dst)
	if err != nil && c.clearDeadline && errors.Is(err, os.ErrDeadlineExceeded) {
		c.g.reject(ReasonHandshakeTimeout, c.RemoteAddr(), "listener handshake")
	}
	if n > 0 {
		if v := c.p.feed(dst[:n]); v != nil {
			c.readErr = v
			c.g.reject(v.reason, c.RemoteAddr(), v.detail)
			_ = c.Close()
			return 0, v
		}
		if c.clearDeadline && c.p.handshakeDone() {
			c.clearDeadline = false
			_ = c.Conn.SetReadDeadline(time.Time{})
		}
		if len(b) < readBufSize {
			k := copy(b, dst[:n])
			c.pend = dst[k:n]
			n = k
			if len(c.pend) > 0 && err != nil {
				c.readErr, err = err, nil // deliver the buffered bytes first
			}
		}
	}
	return n, err
}

// Write bounds every write by the write timeout; a peer that stops reading
// is closed rather than blocking zmq4's writer forever.
func (c *guardConn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	skipped := 0
	if c.swallow > 0 {
		skipped = min(c.swallow, len(b))
		c.swallow -= skipped
		b = b[skipped:]
		if len(b) == 0 {
			return skipped, nil
		}
	}
	_ = c.Conn.SetWriteDeadline(time.Now().Add(c.g.writeTimeout))
	n, err := c.Conn.Write(b)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			c.g.reject(ReasonWriteStall, c.RemoteAddr(), err.Error())
		}
		// A failed write leaves the stream unusable; close it, since zmq4
		// does not close a connection whose handshake write failed.
		_ = c.Close()
	}
	return skipped + n, err
}

func (c *guardConn) Close() error {
	err := net.ErrClosed
	c.closeOnce.Do(func() {
		err = c.Conn.Close()
		if c.onClose != nil {
			c.onClose()
		}
	})
	return err
}

// dialGuarded connects to addr and wraps the connection for the client
// side: the handshake is bounded by the read deadline, cleared once the
// peer's READY has been validated; closing ctx (the zmq4 socket's life
// line) closes the connection.
func (g *guard) dialGuarded(ctx context.Context, d interface {
	DialContext(context.Context, string, string) (net.Conn, error)
}, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	gc := newGuardConn(g, c, "ROUTER")
	gc.clearDeadline = true
	_ = c.SetReadDeadline(time.Now().Add(g.hsTimeout))
	stop := context.AfterFunc(ctx, func() { _ = gc.Close() })
	gc.onClose = func() { stop() }
	return gc, nil
}
