package deploy

// examplePod: a rendered pod laid out on this host as the kubelet would
// run it (volumes, environment, user, network namespace), for
// k8s_start_test.go.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

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
