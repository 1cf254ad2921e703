package deploy

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// netns is a network namespace the test creates for itself, held by one
// locked OS thread: what runs through do (a dial, starting a child, which
// inherits the namespace) happens inside it, nothing else of the test
// process moves. It lets a daemon bind 0.0.0.0 as its manifest says
// without being reachable from anything but this test; the namespace ends
// with the thread and the children started in it.
type netns struct {
	file *os.File // the namespace, for ip link ... netns
	work chan func()
	done chan struct{}
}

// newNetns creates a namespace with only its loopback interface, up. The
// caller needs CAP_SYS_ADMIN.
func newNetns(t *testing.T, ipBin string) *netns {
	t.Helper()
	n := &netns{work: make(chan func()), done: make(chan struct{})}
	errc := make(chan error, 1)
	go func() {
		defer close(n.done)
		// Never unlocked: this thread leaves the host's namespace, so it
		// must end with the goroutine rather than go back to the pool.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare a network namespace: %w", err)
			return
		}
		f, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		n.file = f
		errc <- nil
		for fn := range n.work {
			fn()
		}
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		close(n.work)
		<-n.done
		n.file.Close()
	})
	n.ip(t, ipBin, nil, "link", "set", "lo", "up")
	return n
}

// do runs f on the namespace's thread and waits for it.
func (n *netns) do(f func()) {
	done := make(chan struct{})
	n.work <- func() { defer close(done); f() }
	<-done
}

// ip runs the ip tool inside the namespace; extra are its fds 3, 4, ...
func (n *netns) ip(t *testing.T, ipBin string, extra []*os.File, args ...string) {
	t.Helper()
	var out []byte
	var err error
	n.do(func() {
		cmd := exec.Command(ipBin, args...)
		cmd.ExtraFiles = extra
		out, err = cmd.CombinedOutput()
	})
	if err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// dial connects from inside the namespace. A literal IP address dials on
// the calling goroutine, so the socket is made on the namespace's thread.
func (n *netns) dial(ctx context.Context, network, addr string) (c net.Conn, err error) {
	n.do(func() {
		d := net.Dialer{Timeout: 2 * time.Second}
		c, err = d.DialContext(ctx, network, addr)
	})
	return c, err
}

// linkNetns joins two namespaces with a veth pair, a with address ipA and
// b with ipB on one /24, as two pods on a node's bridge see each other.
func linkNetns(t *testing.T, ipBin string, a, b *netns, ipA, ipB string) {
	t.Helper()
	a.ip(t, ipBin, []*os.File{b.file}, "link", "add", "pdl0", "type", "veth", "peer", "name", "pdl1", "netns", "/proc/self/fd/3")
	a.ip(t, ipBin, nil, "addr", "add", ipA+"/24", "dev", "pdl0")
	a.ip(t, ipBin, nil, "link", "set", "pdl0", "up")
	b.ip(t, ipBin, nil, "addr", "add", ipB+"/24", "dev", "pdl1")
	b.ip(t, ipBin, nil, "link", "set", "pdl1", "up")
}
