package deploy

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
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
	ipBin := needPodSandbox(t)
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	pre, dec := startExamplePods(ctx, t, ipBin)
	for _, p := range []*examplePod{pre, dec} {
		waitReady(ctx, t, p)
	}
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
	ipBin := needPodSandbox(t)
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	pre, dec := startExamplePods(ctx, t, ipBin)
	for _, p := range []*examplePod{pre, dec} {
		waitReady(ctx, t, p)
	}
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

// examplePod is one rendered pod on this host: its network namespace, its
// volumes as directories, its daemon sidecar as a child process.
type examplePod struct {
	comp string
	spec corev1.PodSpec
	side corev1.Container
	ip   string
	ns   *netns
	vols map[string]string // volume name -> directory
	http *http.Client

	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	mu      sync.Mutex
	lines   []string
}

func newExamplePod(t *testing.T, ipBin, comp string, d *appsv1.Deployment, ip string) *examplePod {
	t.Helper()
	spec := d.Spec.Template.Spec
	if len(spec.InitContainers) != 1 {
		t.Fatalf("%s: want one sidecar", d.Name)
	}
	p := &examplePod{comp: comp, spec: spec, side: spec.InitContainers[0], ip: ip, ns: newNetns(t, ipBin), vols: map[string]string{}}
	tr := &http.Transport{DialContext: p.ns.dial, DisableKeepAlives: true}
	p.http = &http.Client{Transport: tr, Timeout: 5 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return p
}

// ids are the uid, gid and supplementary groups of the sidecar: the
// container's securityContext over the pod's, fsGroup and
// supplementalGroups added as the kubelet does.
func (p *examplePod) ids(t *testing.T) (uid, gid uint32, groups []uint32) {
	t.Helper()
	psc, sc := p.spec.SecurityContext, p.side.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	pick := func(c, pod *int64) *int64 {
		if c != nil {
			return c
		}
		return pod
	}
	var u, g *int64
	if sc != nil {
		u, g = sc.RunAsUser, sc.RunAsGroup
	}
	u, g = pick(u, psc.RunAsUser), pick(g, psc.RunAsGroup)
	if u == nil || g == nil {
		t.Fatalf("%s: no runAsUser/runAsGroup: the image's user is not known here", p.comp)
	}
	if *u == 0 {
		t.Fatalf("%s: runs as root", p.comp)
	}
	if psc.FSGroup != nil {
		groups = append(groups, uint32(*psc.FSGroup))
	}
	for _, s := range psc.SupplementalGroups {
		groups = append(groups, uint32(s))
	}
	return uint32(*u), uint32(*g), groups
}

// fsGroup is the group the kubelet gives the pod's volumes (-1: none).
func (p *examplePod) fsGroup() int {
	if sc := p.spec.SecurityContext; sc != nil && sc.FSGroup != nil {
		return int(*sc.FSGroup)
	}
	return -1
}

// mountVolumes makes each volume of the pod a directory under dir, as the
// kubelet would fill it.
func (p *examplePod) mountVolumes(t *testing.T, dir string, secrets map[string]*corev1.Secret) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	gid := p.fsGroup()
	for _, v := range p.spec.Volumes {
		path := filepath.Join(dir, v.Name)
		switch {
		case v.EmptyDir != nil:
			// The kubelet's emptyDir: 0777; with fsGroup, group-owned by it
			// and setgid, so files made in it stay in the group.
			mode := os.FileMode(0o777)
			if gid >= 0 {
				mode |= os.ModeSetgid
			}
			mkdirOwned(t, path, mode, gid)
		case v.Secret != nil:
			s := secrets[v.Secret.SecretName]
			if s == nil {
				t.Fatalf("%s: volume %s: Secret %s is not in the build", p.comp, v.Name, v.Secret.SecretName)
			}
			mkdirOwned(t, path, 0o755|os.ModeSetgid, gid)
			if err := writeSecretVolume(path, secretFiles(t, s, v.Secret), secretMode(v.Secret, gid), gid); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("%s: volume %s: this test cannot lay out its type", p.comp, v.Name)
		}
		p.vols[v.Name] = path
	}
}

func mkdirOwned(t *testing.T, path string, mode os.FileMode, gid int) {
	t.Helper()
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, 0, gid); err != nil {
		t.Fatal(err)
	}
	// After chown, which clears setgid.
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

// secretFiles are the files of a Secret volume: every key, or the items.
func secretFiles(t *testing.T, s *corev1.Secret, v *corev1.SecretVolumeSource) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	if len(v.Items) == 0 {
		for k, b := range s.Data {
			files[k] = b
		}
		return files
	}
	for _, it := range v.Items {
		b, ok := s.Data[it.Key]
		if !ok {
			t.Fatalf("Secret %s has no key %s", s.Name, it.Key)
		}
		if it.Mode != nil {
			t.Fatalf("Secret volume item %s: per-item modes are not laid out by this test", it.Key)
		}
		files[it.Path] = b
	}
	return files
}

// secretMode is the mode of a Secret volume's files on the node: the
// defaultMode (0644 if unset) and, with an fsGroup, group read added by the
// kubelet's volume ownership (read-only volume).
func secretMode(v *corev1.SecretVolumeSource, gid int) os.FileMode {
	mode := os.FileMode(corev1.SecretVolumeSourceDefaultMode)
	if v.DefaultMode != nil {
		mode = os.FileMode(*v.DefaultMode)
	}
	if gid >= 0 {
		mode |= 0o440
	}
	return mode
}

// writeSecretVolume writes files into dir the way the kubelet's atomic
// writer does: into a fresh ..<timestamp> directory, then ..data is
// switched to it with a rename, and each file name is a symlink to
// ..data/<name>. Calling it again with new contents is what a Secret
// update looks like inside the pod.
func writeSecretVolume(dir string, files map[string][]byte, mode os.FileMode, gid int) error {
	ts, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		return err
	}
	if err := os.Chmod(ts, 0o755); err != nil {
		return err
	}
	for name, b := range files {
		f := filepath.Join(ts, name)
		if err := os.WriteFile(f, b, 0o600); err != nil {
			return err
		}
		if err := os.Chown(f, 0, gid); err != nil {
			return err
		}
		if err := os.Chmod(f, mode); err != nil {
			return err
		}
	}
	old, _ := os.Readlink(filepath.Join(dir, "..data"))
	tmp := filepath.Join(dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
		return err
	}
	for name := range files {
		link := filepath.Join(dir, name)
		if _, err := os.Lstat(link); errors.Is(err, os.ErrNotExist) {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				return err
			}
		}
	}
	if old != "" {
		return os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}

// env is the sidecar's environment as the kubelet builds it: the values,
// $(VAR) references to earlier variables expanded, status.podIP from the
// downward API; then paths under a mount are mapped onto the volume's
// directory. Nothing from the test's own environment leaks in.
func (p *examplePod) env(t *testing.T) []string {
	t.Helper()
	vals := map[string]string{}
	var out []string
	for _, e := range p.side.Env {
		v := expandVars(e.Value, vals)
		if e.ValueFrom != nil {
			if e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "status.podIP" {
				t.Fatalf("%s: env %s: this test maps only fieldRef status.podIP", p.comp, e.Name)
			}
			v = p.ip
		}
		v = p.hostPath(v)
		vals[e.Name] = v
		out = append(out, e.Name+"="+v)
	}
	return out
}

// expandVars expands $(NAME) with the variables defined so far, as
// Kubernetes does: $$ is a literal $, an unknown $(NAME) stays as it is.
func expandVars(s string, vars map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				b.WriteString(s[i:])
				return b.String()
			}
			ref := s[i : i+3+end]
			if v, ok := vars[s[i+2:i+2+end]]; ok {
				b.WriteString(v)
			} else {
				b.WriteString(ref)
			}
			i += len(ref) - 1
		default:
			b.WriteByte('$')
		}
	}
	return b.String()
}

// hostPath maps an absolute path (or unix:// URL) under one of the
// sidecar's mounts onto the volume's directory; anything else is returned
// as it is.
func (p *examplePod) hostPath(v string) string {
	scheme, path := "", v
	if s, rest, ok := strings.Cut(v, "://"); ok {
		scheme, path = s+"://", rest
	}
	if !strings.HasPrefix(path, "/") {
		return v
	}
	best := -1
	for i, m := range p.side.VolumeMounts {
		mp := strings.TrimSuffix(m.MountPath, "/")
		if (path == mp || strings.HasPrefix(path, mp+"/")) && (best < 0 || len(mp) > len(p.side.VolumeMounts[best].MountPath)) {
			best = i
		}
	}
	if best < 0 {
		return v
	}
	m := p.side.VolumeMounts[best]
	return scheme + p.vols[m.Name] + strings.TrimPrefix(path, strings.TrimSuffix(m.MountPath, "/"))
}

// start runs the sidecar's command as its user, inside the pod's network
// namespace. The image's /usr/local/bin is the freshly built binaries.
func (p *examplePod) start(t *testing.T, bins string) {
	t.Helper()
	if len(p.side.Command) == 0 || filepath.Dir(p.side.Command[0]) != "/usr/local/bin" {
		t.Fatalf("%s: command %q: want /usr/local/bin/<daemon>", p.comp, p.side.Command)
	}
	vals := map[string]string{}
	for _, kv := range p.env(t) {
		k, v, _ := strings.Cut(kv, "=")
		vals[k] = v
	}
	var args []string
	for _, a := range append(p.side.Command[1:], p.side.Args...) {
		args = append(args, p.hostPath(expandVars(a, vals)))
	}
	uid, gid, groups := p.ids(t)
	p.cmd = exec.Command(filepath.Join(bins, filepath.Base(p.side.Command[0])), args...)
	p.cmd.Env = p.env(t)
	p.cmd.Dir = "/"
	p.cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: uid, Gid: gid, Groups: groups},
		// The namespace's thread is the parent: if the test dies, so does
		// the daemon.
		Pdeathsig: syscall.SIGKILL,
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.ns.do(func() { err = p.cmd.Start() })
	if err != nil {
		t.Fatalf("%s: start %s: %v", p.comp, p.cmd.Path, err)
	}
	p.exited = make(chan struct{})
	go func() {
		defer close(p.exited)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, stderr)
		p.waitErr = p.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
			if p.waitErr != nil {
				t.Errorf("%s: exit after SIGTERM: %v\n%s", p.comp, p.waitErr, p.logs())
			}
		case <-time.After(45 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
			t.Errorf("%s: no exit within 45s of SIGTERM\n%s", p.comp, p.logs())
		}
	})
}

func (p *examplePod) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.lines, "\n")
}

// logField is field of the first JSON log line with message msg, or "".
func (p *examplePod) logField(msg, field string) string {
	return p.findLogField(msg, field, false)
}

// lastLogField is field of the last JSON log line with message msg, or "".
func (p *examplePod) lastLogField(msg, field string) string {
	return p.findLogField(msg, field, true)
}

func (p *examplePod) findLogField(msg, field string, last bool) string {
	p.mu.Lock()
	lines := slices.Clone(p.lines)
	p.mu.Unlock()
	if last {
		slices.Reverse(lines)
	}
	for _, l := range lines {
		if strings.Contains(l, `"msg":"`+msg+`"`) {
			if _, rest, ok := strings.Cut(l, `"`+field+`":"`); ok {
				v, _, _ := strings.Cut(rest, `"`)
				return v
			}
		}
	}
	return ""
}

// port is the number of the sidecar's named container port.
func (p *examplePod) port(t *testing.T, name string) int32 {
	t.Helper()
	if n := portByName(p.side, name); n != 0 {
		return n
	}
	t.Fatalf("%s: no container port %s", p.comp, name)
	return 0
}

// get does what the kubelet's httpGet probe does: GET http://<pod IP>:<port>.
func (p *examplePod) get(ctx context.Context, t *testing.T, path string) (int, string, error) {
	url := fmt.Sprintf("http://%s%s", net.JoinHostPort(p.ip, fmt.Sprint(p.port(t, "metrics"))), path)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := p.http.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// metric is the sum of the samples of a metric family, or of the series
// whose line starts with name when it holds a '{' (`family{label="v"`); a
// selection that matches nothing fails the test.
func (p *examplePod) metric(ctx context.Context, t *testing.T, name string) float64 {
	t.Helper()
	code, body, err := p.get(ctx, t, "/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("%s: /metrics: %d %v", p.comp, code, err)
	}
	var sum float64
	found := false
	for _, line := range strings.Split(body, "\n") {
		if strings.Contains(name, "{") && !strings.HasPrefix(line, name) ||
			!strings.Contains(name, "{") && !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err != nil {
			t.Fatalf("%s: sample %q: %v", p.comp, line, err)
		}
		sum, found = sum+v, true
	}
	if !found {
		t.Fatalf("%s: no sample of %s", p.comp, name)
	}
	return sum
}

// waitReady polls /readyz as the readiness probe does, until 200; a daemon
// that exits fails the test with its log.
func waitReady(ctx context.Context, t *testing.T, p *examplePod) {
	t.Helper()
	eventually(ctx, t, p.comp+" /readyz 200", func() (bool, error) {
		select {
		case <-p.exited:
			t.Fatalf("%s exited: %v\n%s", p.comp, p.waitErr, p.logs())
		default:
		}
		code, _, err := p.get(ctx, t, "/readyz")
		return code == http.StatusOK, err
	})
}

// procIDs reads the daemon's credentials from /proc.
func (p *examplePod) procIDs(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	f := map[string][]string{}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok {
			f[k] = strings.Fields(v)
		}
	}
	if len(f["Uid"]) == 0 || len(f["Gid"]) == 0 {
		t.Fatalf("%s: /proc status without Uid or Gid", p.comp)
	}
	return fmt.Sprintf("uid %s gid %s groups %v", f["Uid"][0], f["Gid"][0], f["Groups"])
}

// newExampleSim connects the simulated engines to both daemons: regions in
// the prefill pod's /dev/shm volume (both simulated engines share it),
// created as the pod's user as an engine in the pod would; the bootstrap
// address is the prefill pod's IP with the rendered port, as a router
// would hand it to the decode engine.
func newExampleSim(ctx context.Context, t *testing.T, pre, dec *examplePod) *sim.Sim {
	t.Helper()
	shm := ""
	for _, m := range pre.side.VolumeMounts {
		if m.MountPath == "/dev/shm" {
			shm = pre.vols[m.Name]
		}
	}
	if shm == "" {
		t.Fatal("prefill: no /dev/shm volume")
	}
	bootstrap := "tcp://" + net.JoinHostPort(pre.ip, fmt.Sprint(pre.port(t, "bootstrap")))
	cfg := sim.Config{
		PrefillGRPC: pre.hostPath(env(pre.side, "PDLINK_GRPC_LISTEN")),
		DecodeGRPC:  dec.hostPath(env(dec.side, "PDLINK_GRPC_LISTEN")),
		Bootstrap:   bootstrap,
		Dir:         shm,
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
