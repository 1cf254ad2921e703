package auth_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/pdlink/pdlink/pkg/auth"
	"github.com/pdlink/pdlink/pkg/transfer"
)

// outcomes records the receiver's events.
type outcomes struct {
	mu   sync.Mutex
	done map[transfer.Key]string // "" = complete, else the failure reason
	ch   chan struct{}
}

func newOutcomes() *outcomes {
	return &outcomes{done: map[transfer.Key]string{}, ch: make(chan struct{}, 1)}
}

func (o *outcomes) set(k transfer.Key, r string) {
	o.mu.Lock()
	o.done[k] = r
	o.mu.Unlock()
	select {
	case o.ch <- struct{}{}:
	default:
	}
}

func (o *outcomes) Progress(transfer.Key, int64)                      {}
func (o *outcomes) Complete(k transfer.Key)                           { o.set(k, "") }
func (o *outcomes) Failed(k transfer.Key, r transfer.Reason, _ error) { o.set(k, string(r)) }

func (o *outcomes) wait(t testing.TB, k transfer.Key) string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		o.mu.Lock()
		r, ok := o.done[k]
		o.mu.Unlock()
		if ok {
			return r
		}
		select {
		case <-o.ch:
		case <-deadline:
			t.Fatalf("room %v: no outcome within 10s", k)
		}
	}
}

func openRegion(t testing.TB, l transfer.Layout) *transfer.Region {
	t.Helper()
	dir := "/dev/shm"
	if _, err := os.Stat(dir); err != nil {
		dir = t.TempDir()
	}
	path, err := transfer.CreateRegionFile(dir, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
	r, err := transfer.OpenRegion(path, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// dataRig is a Sender and a Receiver over loopback TCP, each with its own
// Authenticator (nil: NoAuth).
type dataRig struct {
	src, dst *transfer.Region
	snd      *transfer.Sender
	rcv      *transfer.Receiver
	ev       *outcomes
	addr     string
}

func newDataRig(t testing.TB, l transfer.Layout, sendAuth, recvAuth transfer.Authenticator) *dataRig {
	t.Helper()
	g := &dataRig{src: openRegion(t, l), dst: openRegion(t, l), ev: newOutcomes()}
	var err error
	if g.rcv, err = transfer.NewReceiver(g.dst, transfer.ReceiverConfig{Auth: recvAuth, HandshakeTimeout: 2 * time.Second}, g.ev); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g.addr = ln.Addr().String()
	served := make(chan struct{})
	go func() { defer close(served); _ = g.rcv.Serve(ln) }()
	if g.snd, err = transfer.NewSender(g.src, transfer.SenderConfig{Auth: sendAuth, DialTimeout: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	if err := g.snd.AddPeer(g.addr, l); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.snd.Close()
		g.rcv.Close()
		<-served
	})
	return g
}

// room expects and sends room k over pages [first, first+n) of every
// buffer and returns the sender's Done channel.
func (g *dataRig) room(t testing.TB, k transfer.Key, first, n int32) chan error {
	t.Helper()
	l := g.src.Layout()
	runs := transfer.SamePages(len(l.Buffers), []transfer.Run{{Start: first, Count: n}})
	if err := g.rcv.Expect(transfer.Expectation{Key: k, Dst: runs, AuxRow: -1}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := g.snd.Send(ctx, transfer.SendRequest{Peer: g.addr, Key: k, Src: runs, Dst: runs, Done: func(err error) { done <- err }}); err != nil {
		t.Fatal(err)
	}
	return done
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 1))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
}

func sameBuffers(t *testing.T, a, b *transfer.Region) bool {
	t.Helper()
	for i := range a.Layout().Buffers {
		if !bytes.Equal(a.Buffer(i), b.Buffer(i)) {
			return false
		}
	}
	return true
}

// TestDataConnectionThatFailsTheChallengeChangesNothing: while a victim
// room moves over authenticated connections, an attacker with the wrong
// token and one without auth at all connect to the receiver and offer a
// chunk for the victim's room. Both are refused before any chunk is read,
// counted, and the victim room succeeds with the right bytes.
func TestDataConnectionThatFailsTheChallengeChangesNothing(t *testing.T) {
	l := transfer.UniformLayout(2, 16, 4096, 0, 0)
	sk, rk := keyring(t, token), keyring(t, token)
	g := newDataRig(t, l, sk.Data(), rk.Data())
	for i := range l.Buffers {
		fill(g.src.Buffer(i), uint64(i+1))
	}
	victim := transfer.Key{Room: 7, Nonce: 99}

	// Attacker 1: speaks the preface with another token.
	c1, err := net.Dial("tcp", g.addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = keyring(t, otherToken).Data().Client(ctx, c1)
	if !errors.Is(err, auth.ErrChallengeRefused) {
		t.Fatalf("attacker with another token: %v", err)
	}
	// Attacker 2: no preface, straight to a data frame (64-byte header).
	c2, err := net.Dial("tcp", g.addr)
	if err != nil {
		t.Fatal(err)
	}
	hdr := make([]byte, 64)
	copy(hdr, "PDKV")
	_, _ = c2.Write(hdr)
	_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadAll(c2); errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("attacker 2 not closed: %v", err)
	}
	c2.Close()

	if err := <-g.room(t, victim, 0, 16); err != nil {
		t.Fatalf("victim room: %v", err)
	}
	if r := g.ev.wait(t, victim); r != "" {
		t.Fatalf("victim room failed on decode: %s", r)
	}
	if !sameBuffers(t, g.src, g.dst) {
		t.Fatal("victim pages differ")
	}
	st := rk.Stats()
	if st.Rejected(auth.ReasonChallengeFailed) != 1 || st.Rejected(auth.ReasonChallengeProtocol) != 1 || st.Handshakes < 1 {
		t.Fatalf("receiver stats %+v", st)
	}
	if g.rcv.Stats().DiscardedChunks != 0 || g.rcv.Stats().RejectedFrames != 0 {
		t.Fatalf("a refused connection reached the frame reader: %+v", g.rcv.Stats())
	}
}

// TestSenderWithAnotherTokenMovesNoByte: the prefill side holds another
// token; its connections fail the challenge on both sides, nothing lands.
func TestSenderWithAnotherTokenMovesNoByte(t *testing.T) {
	l := transfer.UniformLayout(1, 4, 4096, 0, 0)
	sk, rk := keyring(t, otherToken), keyring(t, token)
	g := newDataRig(t, l, sk.Data(), rk.Data())
	fill(g.src.Buffer(0), 3)
	k := transfer.Key{Room: 1, Nonce: 2}
	done := g.room(t, k, 0, 4)
	deadline := time.Now().Add(10 * time.Second)
	for sk.Stats().Rejected(auth.ReasonChallengeRefused) == 0 || rk.Stats().Rejected(auth.ReasonChallengeFailed) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal counted: sender %+v receiver %+v", sk.Stats(), rk.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	g.snd.Fence(k)
	g.rcv.Fence(k)
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("room succeeded without a valid proof")
		}
	default:
	}
	if !bytes.Equal(g.dst.Buffer(0), make([]byte, len(g.dst.Buffer(0)))) {
		t.Fatal("bytes landed")
	}
}

// BenchmarkDataPlane moves 64 MiB rooms over loopback TCP with auth off and
// on, in the same run: the preface runs once per pooled connection, so the
// difference is noise.
func BenchmarkDataPlane(b *testing.B) {
	l := transfer.UniformLayout(2, 32, 1<<20, 0, 0) // 64 MiB per room
	for _, tc := range []struct {
		name string
		auth func() transfer.Authenticator
	}{
		{"auth=off", func() transfer.Authenticator { return nil }},
		{"auth=on", func() transfer.Authenticator { return keyring(b, token).Data() }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			g := newDataRig(b, l, tc.auth(), tc.auth())
			b.SetBytes(l.Size())
			b.ResetTimer()
			for i := range b.N {
				k := transfer.Key{Room: uint64(i + 1), Nonce: 1}
				if err := <-g.room(b, k, 0, 32); err != nil {
					b.Fatal(err)
				}
				g.ev.wait(b, k)
				g.rcv.Fence(k)
			}
		})
	}
}
