package daemon

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
)

// The tests below talk raw TCP and hand-built HTTP/2 frames to a real
// server on 127.0.0.1, to play clients that gRPC's own client never is.

const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// HTTP/2 frame types and flags used here.
const (
	h2Settings = 0x4
	h2Ping     = 0x6
	h2GoAway   = 0x7
	h2Ack      = 0x1

	h2ErrEnhanceYourCalm = 0xb
)

func h2Frame(typ, flags byte, payload []byte) []byte {
	b := make([]byte, 9, 9+len(payload))
	b[0], b[1], b[2] = byte(len(payload)>>16), byte(len(payload)>>8), byte(len(payload))
	b[3], b[4] = typ, flags
	return append(b, payload...)
}

type h2FrameIn struct {
	typ, flags byte
	payload    []byte
}

func readH2Frame(c net.Conn) (h2FrameIn, error) {
	var hdr [9]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return h2FrameIn{}, err
	}
	n := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
	f := h2FrameIn{typ: hdr[3], flags: hdr[4], payload: make([]byte, n)}
	_, err := io.ReadFull(c, f.payload)
	return f, err
}

// tcpServer runs a daemon with its gRPC listener on 127.0.0.1 and the
// connection limits short enough for a test.
func tcpServer(t *testing.T, tweak func(*Config)) *Server {
	t.Helper()
	cfg := testConfig(t)
	cfg.GRPCListen = "127.0.0.1:0"
	cfg.GRPCHandshakeTimeout = time.Second
	cfg.GRPCMaxConnectionIdle = time.Second
	cfg.GRPCKeepaliveTime = time.Second
	cfg.GRPCKeepaliveTimeout = time.Second
	cfg.GRPCKeepaliveMinTime = 100 * time.Millisecond
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := NewServer(cfg, zap.NewNop(), "test")
	if err != nil {
		t.Fatal(err)
	}
	runServer(t, s)
	return s
}

func dialTCP(t *testing.T, s *Server) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", s.GRPCAddr().String(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// closedWithin reads (and drops) what the server sends until it closes
// the connection, and reports whether that happened within d.
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	buf := make([]byte, 4096)
	for {
		if _, err := c.Read(buf); err != nil {
			var ne net.Error
			return !(errors.As(err, &ne) && ne.Timeout())
		}
	}
}

// A client sending its handshake one byte a second is closed by the
// handshake deadline; before, gRPC's 120s default let it sit there.
func TestTCPClientDribblingTheHandshakeIsClosed(t *testing.T) {
	s := tcpServer(t, nil)
	c := dialTCP(t, s)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		hello := h2Preface + string(h2Frame(h2Settings, 0, nil))
		for i := 0; i < len(hello); i++ {
			if _, err := c.Write([]byte{hello[i]}); err != nil {
				return
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	start := time.Now()
	closed := closedWithin(c, 10*time.Second)
	close(stop)
	wg.Wait()
	if !closed {
		t.Fatalf("dribbling client still open after %v (handshake timeout 1s)", time.Since(start))
	}
}

// 200 connections that never send a byte are all closed by the handshake
// deadline, and the server still serves a well-behaved client.
func TestIdleTCPConnectionsAreClosed(t *testing.T) {
	s := tcpServer(t, nil)
	conns := make([]net.Conn, 200)
	for i := range conns {
		conns[i] = dialTCP(t, s)
	}
	deadline := time.Now().Add(15 * time.Second)
	for i, c := range conns {
		if !closedWithin(c, time.Until(deadline)) {
			t.Fatalf("idle connection %d of %d still open 15s after dialing (handshake timeout 1s)", i, len(conns))
		}
	}
	waitFor(t, func() bool { return s.grpcLimit.open() == 0 })
	if st := grpcHealth(t, s); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health %v after the idle connections", st)
	}
}

// A client that finishes the handshake and then goes silent (no stream, no
// ping acks) is closed by the keepalive ping it does not answer; the idle
// limit (the other way out) is long here and covered by the Watch test.
func TestSilentTCPClientAfterTheHandshakeIsClosed(t *testing.T) {
	s := tcpServer(t, func(c *Config) { c.GRPCMaxConnectionIdle = time.Minute })
	c := dialTCP(t, s)
	if _, err := c.Write(append([]byte(h2Preface), h2Frame(h2Settings, 0, nil)...)); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(c, 15*time.Second) {
		t.Fatal("silent client still open 15s after its handshake (keepalive 1s, ack timeout 1s)")
	}
}

// A Watch stream with no traffic is not idle: it outlives a silent
// connection opened after it (closed by the 1s idle limit and the GOAWAY
// that follows), answers the server's keepalive pings, and still delivers
// the next event.
func TestQuietWatchStreamOutlivesTheIdleAndKeepaliveLimits(t *testing.T) {
	s := tcpServer(t, nil)
	conn, err := grpc.NewClient("passthrough:///"+s.GRPCAddr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, PermitWithoutStream: true}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	watch, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := watch.Recv(); err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first watched status %v, %v", resp, err)
	}

	silent := dialTCP(t, s)
	if _, err := silent.Write(append([]byte(h2Preface), h2Frame(h2Settings, 0, nil)...)); err != nil {
		t.Fatal(err)
	}
	if !closedWithin(silent, 15*time.Second) {
		t.Fatal("silent client not closed within 15s")
	}

	s.health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	resp, err := watch.Recv()
	if err != nil || resp.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("quiet Watch stream was cut: %v, %v", resp, err)
	}
}

// pingEvery sends n pings spaced by every on a handshaked raw connection
// and returns how many were acked and the GOAWAY error code, if any.
func pingEvery(t *testing.T, c net.Conn, n int, every time.Duration) (acked int, goAway uint32, gotGoAway bool) {
	t.Helper()
	if _, err := c.Write(append([]byte(h2Preface), h2Frame(h2Settings, 0, nil)...)); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex // serialises writes: the reader acks the server's frames
	write := func(b []byte) error { mu.Lock(); defer mu.Unlock(); _, err := c.Write(b); return err }
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.SetReadDeadline(time.Now().Add(time.Duration(n)*every + 10*time.Second))
		for {
			f, err := readH2Frame(c)
			if err != nil {
				return
			}
			switch {
			case f.typ == h2Settings && f.flags&h2Ack == 0:
				_ = write(h2Frame(h2Settings, h2Ack, nil))
			case f.typ == h2Ping && f.flags&h2Ack != 0:
				if string(f.payload) == "pdlink-t" {
					acked++
					if acked == n {
						return
					}
				}
			case f.typ == h2Ping:
				_ = write(h2Frame(h2Ping, h2Ack, f.payload))
			case f.typ == h2GoAway && len(f.payload) >= 8:
				goAway, gotGoAway = binary.BigEndian.Uint32(f.payload[4:8]), true
			}
		}
	}()
	pace := time.NewTicker(every)
	defer pace.Stop()
	for i := 0; i < n; i++ {
		if err := write(h2Frame(h2Ping, 0, []byte("pdlink-t"))); err != nil {
			break
		}
		<-pace.C
	}
	<-done
	return acked, goAway, gotGoAway
}

// A client may ping as often as --grpc-keepalive-min-time allows, with no
// stream open, and keeps its connection; a ping flood gets GOAWAY
// ENHANCE_YOUR_CALM (too_many_pings).
func TestClientPingsAtTheAllowedRateKeepTheConnectionAndAFloodIsRefused(t *testing.T) {
	s := tcpServer(t, func(c *Config) {
		c.GRPCMaxConnectionIdle = time.Minute
		c.GRPCKeepaliveTime = time.Minute
		c.GRPCKeepaliveMinTime = 50 * time.Millisecond
	})
	const n = 8
	acked, code, goAway := pingEvery(t, dialTCP(t, s), n, 150*time.Millisecond)
	if acked != n || goAway {
		t.Fatalf("pings every 150ms (min 50ms): %d of %d acked, GOAWAY %v code %d", acked, n, goAway, code)
	}
	_, code, goAway = pingEvery(t, dialTCP(t, s), 20, time.Millisecond)
	if !goAway || code != h2ErrEnhanceYourCalm {
		t.Fatalf("ping flood: GOAWAY %v code %d, want ENHANCE_YOUR_CALM", goAway, code)
	}
}

// Beyond --grpc-max-connections a connection is closed at once and
// counted; a slot freed by a client that leaves is reused.
func TestConnectionsBeyondTheLimitAreClosedOnAccept(t *testing.T) {
	s := tcpServer(t, func(c *Config) {
		c.GRPCMaxConnections = 4
		c.GRPCHandshakeTimeout = time.Minute
	})
	held := make([]net.Conn, 4)
	for i := range held {
		held[i] = dialTCP(t, s)
		if !accepted(t, held[i]) {
			t.Fatalf("connection %d of 4 refused", i)
		}
	}
	over := dialTCP(t, s)
	if !closedWithin(over, 5*time.Second) {
		t.Fatal("connection beyond the limit of 4 not closed within 5s")
	}
	if got := s.grpcLimit.refused.Load(); got != 1 {
		t.Errorf("refused %d, want 1", got)
	}
	if !strings.Contains(scrape(t, s), `pdlink_grpc_connections_refused_total{side="decode"} 1`) {
		t.Error("refused connection not in /metrics")
	}
	held[0].Close()
	waitFor(t, func() bool { return s.grpcLimit.open() == 3 })
	if !accepted(t, dialTCP(t, s)) {
		t.Fatal("connection refused after a slot was freed")
	}
}

// accepted reports whether the server took the connection: gRPC sends its
// SETTINGS first, while a refused connection reads EOF.
func accepted(t *testing.T, c net.Conn) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	f, err := readH2Frame(c)
	return err == nil && f.typ == h2Settings
}
