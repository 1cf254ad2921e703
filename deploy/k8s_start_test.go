package deploy

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/pdlink/pdlink/internal/sim"
	"github.com/pdlink/pdlink/pkg/auth"
)

// Pod IPs of the test's two pods. They exist only in the network
// namespaces the test creates.
const (
	prefillPodIP = "10.244.0.2"
	decodePodIP  = "10.244.0.3"
)

// TestExampleOverlayStartsAsRendered starts the daemons of the example
// overlay exactly as Kubernetes would run them: the rendered command, env
// and mounts, as the rendered user and groups, and with the rendered
// addresses and ports (0.0.0.0 wildcards included, so the daemons' refusal
// of a non-loopback listener without a secret is really in play). Each pod
// is its own network namespace, the two joined by a veth pair, so ports
// are the rendered ones, the downward API's status.podIP is the pod's
// address on that link, and a decode daemon advertising something other
// than its pod IP is not reachable from the prefill pod. Volumes are
// directories: emptyDirs as the kubelet makes them (0777, group fsGroup)
// and the Secret volume in the kubelet's layout (token -> ..data/token ->
// ..<timestamp>/token, root:fsGroup, defaultMode plus 0440). Both daemons
// must answer /readyz 200 and move one room whose bytes the simulated
// decode engine verifies, over authenticated control and data
// connections.
//
// Needs root (network namespaces, the pod's uid) and ip (iproute2).
func TestExampleOverlayStartsAsRendered(t *testing.T) {
	ctx, cancel, pre, dec := readyExamplePods(t)
	defer cancel()
	for _, p := range []*examplePod{pre, dec} {
		if got := p.metric(ctx, t, "pdlink_insecure_mode"); got != 0 {
			t.Errorf("%s: pdlink_insecure_mode %v, want 0", p.comp, got)
		}
	}
	if fp, other := pre.logField("authentication on", "token"), dec.logField("authentication on", "token"); fp == "" || fp != other {
		t.Fatalf("token fingerprints %q (prefill) and %q (decode): want the same one from the shared Secret", fp, other)
	}

	for _, p := range []*examplePod{pre, dec} {
		if w := p.logField("token file", "warning"); w != "" {
			t.Errorf("%s: the daemon warns about the mounted token file: %s", p.comp, w)
		}
		uid, gid, groups := p.ids(t)
		if got, want := p.procIDs(t), fmt.Sprintf("uid %d gid %d groups %v", uid, gid, groups); got != want {
			t.Errorf("%s: daemon runs as %s, want %s", p.comp, got, want)
		}
	}

	s := newExampleSim(ctx, t, pre, dec)
	oneRoom(ctx, t, s, 1, pre, dec)
	for _, p := range []*examplePod{pre, dec} {
		if got := p.metric(ctx, t, "pdlink_auth_rejected_total"); got != 0 {
			t.Errorf("%s: pdlink_auth_rejected_total %v, want 0", p.comp, got)
		}
	}
	// The data connection was authenticated: decode counted the bytes.
	if got := dec.metric(ctx, t, "pdlink_transfer_bytes_total"); got <= 0 {
		t.Errorf("decode: pdlink_transfer_bytes_total %v, want > 0", got)
	}
}

// TestExampleSecretUpdatedInPlaceRotatesOnSIGHUP is the README's
// no-restart rotation on the rendered pods: the Secret volume is updated as
// the kubelet does it (new ..<timestamp> directory, ..data renamed onto
// it), first to "old, new" and then to "new"; after each, SIGHUP makes both
// daemons re-read the file through the swapped symlink, and a room still
// moves with verified bytes. The second reload names the new token as next
// to sign.
func TestExampleSecretUpdatedInPlaceRotatesOnSIGHUP(t *testing.T) {
	ctx, cancel, pre, dec := readyExamplePods(t)
	defer cancel()
	s := newExampleSim(ctx, t, pre, dec)
	oneRoom(ctx, t, s, 1, pre, dec)

	old := pre.token(t)
	fresh := make([]byte, 48)
	_, _ = rand.Read(fresh)
	next := []byte(base64.StdEncoding.EncodeToString(fresh))
	for step, content := range []string{string(old) + "\n" + string(next) + "\n", string(next) + "\n"} {
		for _, p := range []*examplePod{pre, dec} {
			p.updateToken(t, []byte(content))
			if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []*examplePod{pre, dec} {
			want := float64(step + 1)
			eventually(ctx, t, fmt.Sprintf("%s: reload %d", p.comp, step+1), func() (bool, error) {
				return p.metric(ctx, t, `pdlink_auth_token_reloads_total{result="ok"`) >= want, nil
			})
			if got := p.metric(ctx, t, `pdlink_auth_token_reloads_total{result="error"`); got != 0 {
				t.Fatalf("%s: %v reloads refused the updated Secret\n%s", p.comp, got, p.logs())
			}
		}
		oneRoom(ctx, t, s, uint64(step+2), pre, dec)
	}
	kr, err := auth.New(auth.Config{}, next)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*examplePod{pre, dec} {
		if got := p.lastLogField("auth tokens reloaded", "next"); got != kr.Fingerprint() {
			t.Errorf("%s: after the second reload next=%q, want the new token's %s\n%s", p.comp, got, kr.Fingerprint(), p.logs())
		}
	}
}

// token is the first line of the pod's mounted token file.
func (p *examplePod) token(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(p.hostPath(env(p.side, "PDLINK_AUTH_TOKEN_FILE")))
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return []byte(strings.TrimSpace(first))
}

// updateToken rewrites the pod's Secret volume with new content for the
// token's key, as the kubelet does when the Secret changes.
func (p *examplePod) updateToken(t *testing.T, content []byte) {
	t.Helper()
	path := p.hostPath(env(p.side, "PDLINK_AUTH_TOKEN_FILE"))
	for _, v := range p.spec.Volumes {
		if v.Secret != nil && strings.HasPrefix(path, p.vols[v.Name]+"/") {
			name := strings.TrimPrefix(path, p.vols[v.Name]+"/")
			if err := writeSecretVolume(p.vols[v.Name], map[string][]byte{name: content}, secretMode(v.Secret, p.fsGroup()), p.fsGroup()); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("%s: the token file %s is on no Secret volume", p.comp, path)
}

// needPodSandbox skips the test unless it can build pods: root (network
// namespaces, running as the pod's uid, chown to fsGroup) and ip.
func needPodSandbox(t *testing.T) (ipBin string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: it runs the daemons as the pod's user in network namespaces of its own (sudo go test ./deploy -run TestExample)")
	}
	return tool(t, "ip", "iproute2")
}

// readyExamplePods starts the example's pods (startExamplePods) where
// the test can build them, and waits until both answer /readyz. ctx
// bounds the whole test; goleak checks it left no goroutine behind.
func readyExamplePods(t *testing.T) (ctx context.Context, cancel context.CancelFunc, pre, dec *examplePod) {
	t.Helper()
	ipBin := needPodSandbox(t)
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) })
	ctx, cancel = context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel) // should the start fail; the caller cancels first otherwise
	pre, dec = startExamplePods(ctx, t, ipBin)
	for _, p := range []*examplePod{pre, dec} {
		waitReady(ctx, t, p)
	}
	return ctx, cancel, pre, dec
}

// startExamplePods renders the example overlay, lays out both pods and
// starts their daemons.
func startExamplePods(ctx context.Context, t *testing.T, ipBin string) (pre, dec *examplePod) {
	t.Helper()
	objs, err := decodeStrict(renderExample(t))
	if err != nil {
		t.Fatal(err)
	}
	secrets := map[string]*corev1.Secret{}
	deps := map[string]*appsv1.Deployment{}
	for _, o := range objs {
		switch x := o.obj.(type) {
		case *corev1.Secret:
			secrets[x.Name] = x
		case *appsv1.Deployment:
			deps[x.Spec.Template.Labels["app.kubernetes.io/component"]] = x
		}
	}
	if deps["prefill"] == nil || deps["decode"] == nil {
		t.Fatalf("rendered Deployments %v: want prefill and decode", deps)
	}
	root := sharedTempDir(t)
	bins := filepath.Join(root, "bin")
	build := exec.CommandContext(ctx, "go", "build", "-o", bins+"/", "../cmd/prefilld", "../cmd/decoded")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build daemons: %v\n%s", err, out)
	}
	pre = newExamplePod(t, ipBin, "prefill", deps["prefill"], prefillPodIP)
	dec = newExamplePod(t, ipBin, "decode", deps["decode"], decodePodIP)
	linkNetns(t, ipBin, pre.ns, dec.ns, pre.ip, dec.ip)
	for _, p := range []*examplePod{pre, dec} {
		p.mountVolumes(t, filepath.Join(root, p.comp), secrets)
		p.start(t, bins)
	}
	return pre, dec
}

// sharedTempDir is a temporary directory every user can traverse (the
// daemons run as the pod's user, not as the test's).
func sharedTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// newExampleSim connects the simulated engines to both daemons: each
// engine's region in its pod's region volume (the daemon's
// PDLINK_REGION_DIR), created as the pod's user as an engine in the pod
// would; the bootstrap
// address is the prefill pod's IP with the rendered port, as a router
// would hand it to the decode engine.
func newExampleSim(ctx context.Context, t *testing.T, pre, dec *examplePod) *sim.Sim {
	t.Helper()
	regionDir := func(p *examplePod) string {
		dir := env(p.side, "PDLINK_REGION_DIR")
		if dir == "" || strings.Contains(dir, ",") || p.hostPath(dir) == dir {
			t.Fatalf("%s: PDLINK_REGION_DIR %q: want one directory on a volume", p.comp, dir)
		}
		return p.hostPath(dir)
	}
	bootstrap := "tcp://" + net.JoinHostPort(pre.ip, fmt.Sprint(pre.port(t, "bootstrap")))
	cfg := sim.Config{
		PrefillGRPC: pre.hostPath(env(pre.side, "PDLINK_GRPC_LISTEN")),
		DecodeGRPC:  dec.hostPath(env(dec.side, "PDLINK_GRPC_LISTEN")),
		Bootstrap:   bootstrap,
		Dir:         regionDir(pre),
		DecodeDir:   regionDir(dec),
		Layout:      sim.TestLayout(),
	}
	uid, gid, _ := pre.ids(t)
	var s *sim.Sim
	err := asFileUser(int(uid), int(gid), func() error {
		var err error
		s, err = sim.New(ctx, cfg)
		return err
	})
	if err != nil {
		t.Fatalf("sim: %v\nprefilld:\n%s\ndecoded:\n%s", err, pre.logs(), dec.logs())
	}
	t.Cleanup(s.Close)
	return s
}

// oneRoom drives one request (its room id drawn from seed) through both
// daemons and requires Success on both sides with every byte verified.
func oneRoom(ctx context.Context, t *testing.T, s *sim.Sim, seed uint64, pre, dec *examplePod) {
	t.Helper()
	rep, err := s.Run(ctx, sim.Config{Requests: 1, MinTokens: 200, MaxTokens: 200, Concurrency: 1, Seed: seed, PinBound: time.Minute})
	if err != nil {
		t.Fatalf("sim run: %v", err)
	}
	if rep.Outcomes["prefill:success"] != 1 || rep.Outcomes["decode:success"] != 1 || rep.Verified != 1 || rep.Corrupt != 0 || rep.Pinned != 0 {
		t.Fatalf("one room: outcomes %v, verified %d, corrupt %d, pinned %d\nprefilld:\n%s\ndecoded:\n%s",
			rep.Outcomes, rep.Verified, rep.Corrupt, rep.Pinned, pre.logs(), dec.logs())
	}
}

// asFileUser runs f on a thread whose file-system identity is uid and gid,
// so the files f creates (the engines' regions) belong to the pod's user
// as an engine's would, and the daemon, which runs as that user, can map
// them. The thread is discarded afterwards.
func asFileUser(uid, gid int, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread's identity is not restored.
		runtime.LockOSThread()
		if err := syscall.Setfsgid(gid); err != nil {
			errc <- err
			return
		}
		if err := syscall.Setfsuid(uid); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
}
