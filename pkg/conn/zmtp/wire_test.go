package zmtp

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// Hand-built ZMTP 3.0 bytes for hostile peers and parser tests.

func greeting() []byte { g := serverGreeting; return g[:] }

func frameHeader(flags byte, size uint64) []byte {
	if size > 255 || flags&flagLong != 0 {
		h := []byte{flags | flagLong, 0, 0, 0, 0, 0, 0, 0, 0}
		binary.BigEndian.PutUint64(h[1:], size)
		return h
	}
	return []byte{flags, byte(size)}
}

func frame(flags byte, body []byte) []byte {
	return append(frameHeader(flags, uint64(len(body))), body...)
}

func command(name string, body []byte) []byte {
	b := append([]byte{byte(len(name))}, name...)
	return frame(flagCommand, append(b, body...))
}

func props(kv ...string) []byte {
	var b []byte
	for i := 0; i+1 < len(kv); i += 2 {
		b = append(b, byte(len(kv[i])))
		b = append(b, kv[i]...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(kv[i+1])))
		b = append(b, kv[i+1]...)
	}
	return b
}

func ready(socketType, id string) []byte {
	return command(cmdReady, props("Socket-Type", socketType, "Identity", id))
}

// handshake is what a DEALER peer sends first.
func handshake(id string) []byte { return cat(greeting(), ready("DEALER", id)) }

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// Crash inputs for zmq4 v0.17.0 (see TestUnguardedZMQ4RouterPanics).
var (
	// crashHugeFrame: a valid handshake, then a frame claiming 2^50 bytes.
	crashHugeFrame = cat(handshake("x"), frameHeader(flagLong, 1<<50))
	// crashCutReady: a READY whose first property value length has 2 of
	// its 4 bytes inside the body.
	crashCutReady = cat(greeting(), frame(flagCommand,
		cat([]byte{5}, []byte("READY"), []byte{11}, []byte("Socket-Type"), []byte{0, 0})))
	// crashNoSocketType: a well-formed READY without Socket-Type; zmq4
	// panics in SocketType.IsCompatible (found by FuzzGuard).
	crashNoSocketType = cat(greeting(), command(cmdReady, props("Identity", "x")))
)

// rawPeer is a hand-driven TCP peer; what the server sends is collected.
type rawPeer struct {
	net.Conn
	mu   sync.Mutex
	got  []byte
	done chan struct{}
}

func dialRaw(t testing.TB, addr string) *rawPeer {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatalf("raw dial: %v", err)
	}
	p := &rawPeer{Conn: c, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		buf := make([]byte, 4096)
		for {
			n, err := c.Read(buf)
			p.mu.Lock()
			p.got = append(p.got, buf[:n]...)
			p.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(p.close)
	return p
}

func (p *rawPeer) close() { _ = p.Conn.Close(); <-p.done }

func (p *rawPeer) received() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.got)
}

// closedByServer reports whether the server closed the connection within d.
func (p *rawPeer) closedByServer(d time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(d):
		return false
	}
}

var _ io.Reader = (*rawPeer)(nil)
