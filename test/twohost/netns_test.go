package twohost

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The two test hosts: one network namespace each, joined by a veth pair
// that carries the only non-loopback addresses. Nothing is added to the
// root namespace, so the ranges cannot collide with the machine's.
const (
	nsPrefix   = "pdl-"
	prefillIP  = "10.251.16.1"
	decodeIP   = "10.251.16.2"
	vethPrefix = 30
	prefillDev = "pdl-pre"
	decodeDev  = "pdl-dec"
	netnsDir   = "/run/netns"
)

// host is one network namespace: a test host with its veth end.
type host struct {
	ns, ip, dev string
	// client speaks HTTP from inside the namespace (the daemons' /metrics
	// and /debug/rooms, Prometheus' API), so a cut link does not blind it.
	client *http.Client
}

var hostSeq atomic.Int64

// newHosts creates the prefill and decode namespaces and the veth pair,
// with lo up in each, and removes them when the test ends (failed or not).
// It skips the test, saying why, where namespaces cannot be made.
func newHosts(t *testing.T) (pre, dec *host) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("skipping: network namespaces need root (euid %d)", os.Geteuid())
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skipf("skipping: iproute2 not installed: %v", err)
	}
	id := fmt.Sprintf("%s%d-%d", nsPrefix, os.Getpid(), hostSeq.Add(1))
	pre = &host{ns: id + "-prefill", ip: prefillIP, dev: prefillDev}
	dec = &host{ns: id + "-decode", ip: decodeIP, dev: decodeDev}
	for _, h := range []*host{pre, dec} {
		if out, err := ipCmd("netns", "add", h.ns); err != nil {
			t.Skipf("skipping: cannot create a network namespace (ip netns add %s: %v: %s)", h.ns, err, out)
		}
		t.Cleanup(func() {
			if err := removeNamespace(h.ns); err != nil {
				t.Errorf("remove namespace %s: %v", h.ns, err)
			}
		})
		h.client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: dialIn(h.ns), DisableKeepAlives: true}}
	}
	// Both ends are created inside their namespaces: no step leaves a
	// device in the root namespace.
	if out, err := ipCmd("link", "add", pre.dev, "netns", pre.ns, "type", "veth", "peer", "name", dec.dev, "netns", dec.ns); err != nil {
		t.Skipf("skipping: cannot create a veth pair: %v: %s", err, out)
	}
	for _, h := range []*host{pre, dec} {
		for _, args := range [][]string{
			{"link", "set", "lo", "up"},
			{"addr", "add", fmt.Sprintf("%s/%d", h.ip, vethPrefix), "dev", h.dev},
			{"link", "set", h.dev, "up"},
		} {
			if out, err := ipCmd(append([]string{"-n", h.ns}, args...)...); err != nil {
				t.Fatalf("ip -n %s %s: %v: %s", h.ns, strings.Join(args, " "), err, out)
			}
		}
	}
	return pre, dec
}

// command runs name inside the namespace (ip netns exec execs it, so the
// child's pid is the program's own and SIGKILL reaches it).
func (h *host) command(name string, args ...string) (string, []string) {
	return "ip", append([]string{"netns", "exec", h.ns, name}, args...)
}

// setLink sets the host's veth end up or down: on a veth pair, down on one
// end takes the carrier off both.
func (h *host) setLink(t *testing.T, state string) {
	t.Helper()
	if out, err := ipCmd("-n", h.ns, "link", "set", h.dev, state); err != nil {
		t.Fatalf("ip -n %s link set %s %s: %v: %s", h.ns, h.dev, state, err, out)
	}
}

// sysctl sets a per-namespace kernel setting on the host (through
// /proc/sys from inside it, so procps is not needed).
func (h *host) sysctl(t *testing.T, key, value string) {
	t.Helper()
	path := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	name, args := h.command("sh", "-c", `printf '%s\n' "$1" > "$2"`, "sh", value, path)
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s: sysctl %s=%s: %v: %s", h.ns, key, value, err, out)
	}
}

func ipCmd(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// removeNamespace kills what still runs in ns (only this suite starts
// processes there), then deletes it; the veth end inside goes with it.
func removeNamespace(ns string) error {
	if out, err := ipCmd("netns", "pids", ns); err == nil {
		for _, f := range strings.Fields(out) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	// The kernel lets go of a namespace's mount once its last process is
	// reaped; retry a moment for the killed ones.
	var out string
	var err error
	for range 50 {
		if out, err = ipCmd("netns", "del", ns); err == nil {
			return nil
		}
		if _, statErr := os.Stat(netnsDir + "/" + ns); errors.Is(statErr, os.ErrNotExist) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%v: %s", err, out)
}

var leftoverName = regexp.MustCompile(`^` + nsPrefix + `(\d+)-\d+-(prefill|decode)$`)

// removeLeftovers deletes the namespaces of earlier runs of this suite
// whose test process is gone (a run killed before its cleanup). A
// namespace of a run still alive is left to that run.
func removeLeftovers() []string {
	entries, err := os.ReadDir(netnsDir)
	if err != nil {
		return nil
	}
	var removed []string
	for _, e := range entries {
		m := leftoverName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		if pid == os.Getpid() || processAlive(pid) {
			continue
		}
		if err := removeNamespace(e.Name()); err == nil {
			removed = append(removed, e.Name())
		}
	}
	return removed
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// dialIn returns a dialer whose sockets live in network namespace ns. A
// socket keeps the namespace it was created in, so the dial runs on an OS
// thread moved into ns and moved back before it is unlocked; a thread that
// cannot move back stays locked and Go discards it with the goroutine.
func dialIn(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		done := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			c, err := dialOnThreadIn(ctx, ns, network, addr)
			done <- result{c, err}
		}()
		r := <-done
		return r.c, r.err
	}
}

// dialOnThreadIn dials from ns on the calling goroutine's locked thread
// and unlocks it once the thread is back in its own namespace.
func dialOnThreadIn(ctx context.Context, ns, network, addr string) (net.Conn, error) {
	home, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, err
	}
	defer home.Close()
	target, err := os.Open(netnsDir + "/" + ns)
	if err != nil {
		return nil, err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, fmt.Errorf("setns %s: %w", ns, err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
		runtime.UnlockOSThread()
	}
	return c, err
}
