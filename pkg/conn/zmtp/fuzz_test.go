package zmtp

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"
)

// chunkConn is a net.Conn that reads data in chunks whose sizes come from
// a seed, and discards writes.
type chunkConn struct {
	data []byte
	seed byte
	i    int
}

func (c *chunkConn) Read(b []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	c.i++
	n := min(len(b), len(c.data), 1+int(c.seed^byte(c.i*37))%97)
	copy(b, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

func (c *chunkConn) Write(b []byte) (int, error)      { return len(b), nil }
func (c *chunkConn) Close() error                     { c.data = nil; return nil }
func (c *chunkConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *chunkConn) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (c *chunkConn) SetDeadline(time.Time) error      { return nil }
func (c *chunkConn) SetReadDeadline(time.Time) error  { return nil }
func (c *chunkConn) SetWriteDeadline(time.Time) error { return nil }

// teeConn records the bytes the guard let through.
type teeConn struct {
	net.Conn
	passed []byte
}

func (c *teeConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.passed = append(c.passed, b[:n]...)
	return n, err
}

// FuzzGuard feeds arbitrary bytes, in arbitrary chunks, through the
// validating reader into a real zmq4 server-side connection. It must never
// panic (neither the guard nor zmq4 behind it), and what passes the guard
// must never contain a frame over the limit or a malformed READY.
func FuzzGuard(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	o := Options{MaxWireFrame: 1 << 12, MaxCommand: 512}.withDefaults()
	g := newGuard(o, newCounters())
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 {
			return
		}
		tee := &teeConn{Conn: newGuardConn(g, &chunkConn{data: data[1:], seed: data[0]}, "DEALER")}
		zc, err := zmq4.Open(tee, null.Security(), zmq4.Router, zmq4.SocketIdentity("fuzz"), true, nil)
		if err == nil {
			for range 64 {
				if _, err := zc.RecvMsg(); err != nil {
					break
				}
			}
		}
		if err := refCheck(tee.passed, g.lim); err != nil {
			t.Fatalf("guard passed %v: %x", err, tee.passed)
		}
	})
}

// refCheck is an independent, whole-buffer check of what zmq4 v0.17.0
// needs to parse safely: every complete frame header within its limit,
// every complete READY's properties inside its body.
func refCheck(b []byte, lim limits) error {
	if len(b) < greetingLen {
		return nil
	}
	b = b[greetingLen:]
	for len(b) >= 2 {
		fl, hdr, size := b[0], 2, uint64(b[1])
		if fl&flagLong != 0 {
			if len(b) < 9 {
				return nil
			}
			hdr, size = 9, binary.BigEndian.Uint64(b[1:9])
		}
		limit := lim.maxFrame
		if fl&flagCommand != 0 {
			limit = lim.maxCommand
		}
		if size > limit {
			return fmt.Errorf("frame of %d bytes (limit %d)", size, limit)
		}
		if uint64(len(b)-hdr) < size {
			return nil
		}
		body := b[hdr : hdr+int(size)]
		b = b[hdr+int(size):]
		if fl&flagCommand == 0 {
			continue
		}
		if len(body) == 0 || int(body[0]) > len(body)-1 {
			return fmt.Errorf("command name overruns body")
		}
		if string(body[1:1+body[0]]) != cmdReady {
			continue
		}
		for i := 1 + int(body[0]); i < len(body); {
			kl := int(body[i])
			i++
			if i+kl+4 > len(body) {
				return fmt.Errorf("READY property name/length overruns body")
			}
			i += kl
			vl := int(binary.BigEndian.Uint32(body[i:]))
			i += 4
			if vl > len(body)-i {
				return fmt.Errorf("READY property value overruns body")
			}
			i += vl
		}
	}
	return nil
}

// fuzzSeeds are the committed corpus (testdata/fuzz/FuzzGuard); the first
// byte of each seeds the chunking.
func fuzzSeeds() map[string][]byte {
	hs := handshake("seed")
	return map[string][]byte{
		"crash_huge_frame":     cat([]byte{0}, crashHugeFrame),
		"crash_cut_ready":      cat([]byte{3}, crashCutReady),
		"crash_no_socket_type": cat([]byte{4}, crashNoSocketType),
		"valid_session": cat([]byte{7}, hs, frame(0, []byte("hello")), frame(flagMore, []byte("a")),
			frame(0, []byte("b")), command(cmdPing, []byte{0, 1})),
		"long_frame":       cat([]byte{1}, hs, frame(flagLong, make([]byte, 300))),
		"bad_signature":    cat([]byte{0}, []byte("GET / HTTP/1.1\r\n\r\n")),
		"ready_overrun":    cat([]byte{2}, greeting(), frame(flagCommand, []byte("\x05READY\x01k\x00\x00\x01\x00"))),
		"frame_over_limit": cat([]byte{5}, hs, frameHeader(flagLong, 1<<13)),
	}
}

// TestWriteFuzzSeeds regenerates testdata/fuzz/FuzzGuard when
// ZMTP_WRITE_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("ZMTP_WRITE_SEEDS") != "1" {
		t.Skip("set ZMTP_WRITE_SEEDS=1 to rewrite the committed corpus")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzGuard")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range fuzzSeeds() {
		body := "go test fuzz v1\n[]byte(" + strconv.Quote(string(data)) + ")\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
