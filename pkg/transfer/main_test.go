package transfer

import (
	"context"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(benchChildEnv) != "" {
		os.Exit(benchReceiverChild())
	}
	goleak.VerifyTestMain(m)
}

// events records receiver outcomes.
type events struct {
	onProgress func(Key)
	mu         sync.Mutex
	outcome    map[Key]Reason // "" = complete
	progress   map[Key]int64
	changed    chan struct{}
}

func newEvents() *events {
	return &events{outcome: map[Key]Reason{}, progress: map[Key]int64{}, changed: make(chan struct{}, 1)}
}

func (e *events) Progress(k Key, n int64) {
	e.mu.Lock()
	e.progress[k] += n
	f := e.onProgress
	e.mu.Unlock()
	if f != nil {
		f(k)
	}
}

// ev2 installs a hook run on every Progress event.
func (g *rig) ev2(f func(Key)) {
	g.ev.mu.Lock()
	g.ev.onProgress = f
	g.ev.mu.Unlock()
}

func (e *events) Complete(k Key) { e.set(k, "") }

func (e *events) Failed(k Key, r Reason, _ error) { e.set(k, r) }

func (e *events) set(k Key, r Reason) {
	e.mu.Lock()
	if _, dup := e.outcome[k]; dup {
		panic("second outcome for " + k.String())
	}
	e.outcome[k] = r
	e.mu.Unlock()
	select {
	case e.changed <- struct{}{}:
	default:
	}
}

// wait returns the room's outcome, failing the test after a bound.
func (e *events) wait(t testing.TB, k Key) Reason {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		e.mu.Lock()
		r, ok := e.outcome[k]
		e.mu.Unlock()
		if ok {
			return r
		}
		select {
		case <-e.changed:
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			t.Fatalf("room %v: no outcome within 10s", k)
		}
	}
}

func (e *events) get(k Key) (Reason, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, ok := e.outcome[k]
	return r, ok
}

// rig is a source region, a destination region, a Sender and a Receiver connected over
// loopback TCP or a MemNetwork.
type rig struct {
	src, dst *Region
	snd      *Sender
	rcv      *Receiver
	ev       *events
	addr     string
	mem      *MemNetwork
}

func openTestRegion(t testing.TB, l Layout) *Region {
	t.Helper()
	dir := "/dev/shm"
	if _, err := os.Stat(dir); err != nil {
		dir = t.TempDir()
	}
	path, err := CreateRegionFile(dir, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
	r, err := OpenRegion(path, l)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func newRig(t testing.TB, srcL, dstL Layout, tcp bool, sc SenderConfig, rc ReceiverConfig) *rig {
	t.Helper()
	return newRigServing(t, srcL, dstL, tcp, nil, sc, rc)
}

// newRigServing is newRig with the receiver serving wrap(listener) (nil: the listener).
func newRigServing(t testing.TB, srcL, dstL Layout, tcp bool, wrap func(net.Listener) net.Listener, sc SenderConfig, rc ReceiverConfig) *rig {
	t.Helper()
	g := &rig{src: openTestRegion(t, srcL), dst: openTestRegion(t, dstL), ev: newEvents()}
	var err error
	if g.rcv, err = NewReceiver(g.dst, rc, g.ev); err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if tcp {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
	} else {
		g.mem = NewMemNetwork()
		sc.Dialer = g.mem
		ln, err = g.mem.Listen("decode-0")
	}
	if err != nil {
		t.Fatal(err)
	}
	g.addr = ln.Addr().String()
	if wrap != nil {
		ln = wrap(ln)
	}
	served := make(chan struct{})
	go func() { defer close(served); g.rcv.Serve(ln) }()
	if g.snd, err = NewSender(g.src, sc); err != nil {
		t.Fatal(err)
	}
	if err := g.snd.AddPeer(g.addr, dstL); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.snd.Close()
		g.rcv.Close()
		<-served
	})
	return g
}

// send sends a room and returns a channel with its Done error.
func (g *rig) send(t testing.TB, k Key, src, dst [][]Run, aux []byte) chan error {
	t.Helper()
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := g.snd.Send(ctx, SendRequest{Peer: g.addr, Key: k, Src: src, Dst: dst, Aux: aux, Done: func(err error) { done <- err }})
	if err != nil {
		t.Fatalf("send %v: %v", k, err)
	}
	return done
}

func waitDone(t testing.TB, ch chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("send not done within 10s")
		return nil
	}
}

func fill(b []byte, seed uint64) {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(b); i += 8 {
		v := r.Uint64()
		for k := 0; k < 8; k++ {
			b[i+k] = byte(v >> (8 * k))
		}
	}
}

func memset(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}
