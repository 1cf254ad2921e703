package zmtp

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"
)

// guardListener is the net.Listener zmq4's ROUTER accepts from. zmq4
// accepts serially and runs the ZMTP handshake inside its accept loop with
// no deadline, so one peer that stalls would block every later peer. The
// guard therefore runs the whole server handshake itself first, one
// goroutine per connection, bounded in time and number:
//
//  1. check the allow-list, take a pending slot (or close);
//  2. send the server greeting zmq4 would send (version 3.0, NULL);
//  3. read and validate the peer's greeting and READY, under a deadline;
//  4. hand the connection to zmq4 with those bytes queued for replay and
//     zmq4's own 64-byte greeting write swallowed, so zmq4's handshake
//     completes from memory without waiting on the peer.
type guardListener struct {
	g  *guard
	ln net.Listener

	ready   chan *guardConn // handed-over connections for Accept
	pending chan struct{}   // one token per connection in its handshake
	closed  chan struct{}
	once    sync.Once
	wg      sync.WaitGroup // accept loop and handshake goroutines
	stop    func() bool    // context.AfterFunc registration

	mu    sync.Mutex
	conns map[*guardConn]struct{} // every live connection, to close on Close
}

func (g *guard) listenGuarded(ctx context.Context, addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	gl := &guardListener{
		g:       g,
		ln:      ln,
		ready:   make(chan *guardConn),
		pending: make(chan struct{}, g.maxPending),
		closed:  make(chan struct{}),
		conns:   map[*guardConn]struct{}{},
	}
	gl.stop = context.AfterFunc(ctx, func() { _ = gl.Close() })
	gl.wg.Add(1)
	go gl.acceptLoop()
	return gl, nil
}

// Accept returns the next connection whose handshake the guard validated.
func (gl *guardListener) Accept() (net.Conn, error) {
	select {
	case c := <-gl.ready:
		return c, nil
	case <-gl.closed:
		return nil, net.ErrClosed
	}
}

func (gl *guardListener) Addr() net.Addr { return gl.ln.Addr() }

// Close stops accepting, closes every connection it produced and waits for
// its goroutines. It is safe to call more than once.
func (gl *guardListener) Close() error {
	gl.once.Do(func() {
		gl.stop()
		close(gl.closed)
		_ = gl.ln.Close()
		gl.mu.Lock()
		conns := make([]*guardConn, 0, len(gl.conns))
		for c := range gl.conns {
			conns = append(conns, c)
		}
		gl.mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
		gl.wg.Wait()
	})
	return nil
}

func (gl *guardListener) track(c *guardConn) bool {
	gl.mu.Lock()
	defer gl.mu.Unlock()
	select {
	case <-gl.closed:
		return false
	default:
	}
	gl.conns[c] = struct{}{}
	c.onClose = func() {
		gl.mu.Lock()
		delete(gl.conns, c)
		gl.mu.Unlock()
	}
	return true
}

func (gl *guardListener) acceptLoop() {
	defer gl.wg.Done()
	for {
		c, err := gl.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// EMFILE and friends: back off instead of spinning.
			select {
			case <-gl.closed:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		if !gl.g.allowed(c.RemoteAddr()) {
			gl.g.reject(ReasonPeerRefused, c.RemoteAddr(), "not in allowed networks")
			_ = c.Close()
			continue
		}
		select {
		case gl.pending <- struct{}{}:
		default:
			gl.g.reject(ReasonHandshakeOverload, c.RemoteAddr(), "too many pending handshakes")
			_ = c.Close()
			continue
		}
		gc := newGuardConn(gl.g, c, "DEALER")
		if !gl.track(gc) {
			_ = c.Close()
			<-gl.pending
			return
		}
		gl.wg.Add(1)
		go gl.handshake(gc)
	}
}

// handshake runs steps 2-4 of the type comment for one connection.
func (gl *guardListener) handshake(c *guardConn) {
	defer gl.wg.Done()
	defer func() { <-gl.pending }()
	raw := c.Conn
	_ = raw.SetDeadline(time.Now().Add(gl.g.hsTimeout))
	if _, err := raw.Write(serverGreeting[:]); err != nil {
		gl.fail(c, err)
		return
	}
	var buf [512]byte
	for !c.p.handshakeDone() {
		n, err := raw.Read(buf[:])
		if n > 0 {
			if v := c.p.feed(buf[:n]); v != nil {
				gl.g.reject(v.reason, raw.RemoteAddr(), v.detail)
				_ = c.Close()
				return
			}
			c.pend = append(c.pend, buf[:n]...)
		}
		if err != nil && !c.p.handshakeDone() {
			gl.fail(c, err)
			return
		}
	}
	_ = raw.SetDeadline(time.Time{})
	c.swallow = greetingLen
	// The replay holds serverGreeting's counterpart: zmq4 reads the
	// client's greeting and READY from it, then continues on the socket.
	select {
	case gl.ready <- c:
	case <-gl.closed:
		_ = c.Close()
	}
}

func (gl *guardListener) fail(c *guardConn, err error) {
	reason := ReasonHandshakeIncomplete
	if errors.Is(err, net.ErrClosed) {
		_ = c.Close() // listener closing: not the peer's fault
		return
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		reason = ReasonHandshakeTimeout
	}
	gl.g.reject(reason, c.RemoteAddr(), err.Error())
	_ = c.Close()
}
