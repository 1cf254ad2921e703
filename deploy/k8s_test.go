package deploy

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/pdlink/pdlink/internal/daemon"
)

// kustomizeModule is run from the Go module proxy (not a go.mod dependency).
const kustomizeModule = "sigs.k8s.io/kustomize/kustomize/v5@v5.8.2"

const promRulePath = "k8s/base/prometheusrule.yaml"

// prometheusRule renders the PrometheusRule object from the rule file, so
// Kubernetes and systemd hosts run the same, unit-tested rules.
func prometheusRule(t *testing.T) []byte {
	t.Helper()
	var rules map[string]any
	if err := yaml.Unmarshal(readFile(t, rulesPath), &rules); err != nil {
		t.Fatal(err)
	}
	obj := map[string]any{
		"apiVersion": "monitoring.coreos.com/v1",
		"kind":       "PrometheusRule",
		"metadata": map[string]any{
			"name":   "pdlink",
			"labels": map[string]any{"app.kubernetes.io/name": "pdlink"},
		},
		"spec": rules,
	}
	b, err := yaml.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	head := "# Generated from deploy/prometheus/pdlink.rules.yml (edit that file, then run\n" +
		"# go test ./deploy -run TestPrometheusRuleMatchesRuleFile -update).\n"
	return append([]byte(head), b...)
}

func TestPrometheusRuleMatchesRuleFile(t *testing.T) {
	golden(t, promRulePath, prometheusRule(t))
}

// kustomizeBuild runs kustomize build on a directory under deploy/k8s.
func kustomizeBuild(t *testing.T, dir string) []byte {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	cmd := execGo(ctx, "run", kustomizeModule, "build", dir)
	cmd.Dir = wd
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	go func() { done <- cmd.Run() }()
	select {
	case err = <-done:
	case <-time.After(5 * time.Minute):
		_ = cmd.Process.Kill()
		t.Fatalf("kustomize build %s: timed out", dir)
	}
	if err != nil {
		t.Fatalf("kustomize build %s: %v\n%s", dir, err, stderr.Bytes())
	}
	return stdout.Bytes()
}

// exampleTokenFile is the file the example overlay's secretGenerator reads.
// It is not shipped: the operator creates it (README), the tests write a
// fresh random one into a copy of the tree.
const exampleTokenFile = "k8s/overlays/example/auth-token"

// renderExample builds the example overlay from a copy of deploy/k8s with a
// freshly generated token file, as an operator's checkout holds it after the
// README step, and returns the stream.
func renderExample(t *testing.T) []byte {
	t.Helper()
	return renderOverlay(t, "example")
}

// object is one decoded manifest.
type object struct {
	kind, name string
	obj        any
}

// decodeStrict decodes every document of a kustomize build into its API
// type; an unknown or misspelt field, a duplicate key or an unexpected kind
// is an error.
func decodeStrict(stream []byte) ([]object, error) {
	var out []object
	for i, doc := range bytes.Split(stream, []byte("\n---\n")) {
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return nil, fmt.Errorf("document %d: %v", i, err)
		}
		var into any
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 Deployment":
			into = &appsv1.Deployment{}
		case "v1 Service":
			into = &corev1.Service{}
		case "v1 Secret":
			into = &corev1.Secret{}
		case "networking.k8s.io/v1 NetworkPolicy":
			into = &networkingv1.NetworkPolicy{}
		case "monitoring.coreos.com/v1 PodMonitor":
			into = &monitoringv1.PodMonitor{}
		case "monitoring.coreos.com/v1 PrometheusRule":
			into = &monitoringv1.PrometheusRule{}
		default:
			return nil, fmt.Errorf("document %d: unexpected %s %s", i, meta.APIVersion, meta.Kind)
		}
		// As the API server decodes: YAML keys unique, JSON field names
		// matched case-sensitively, no unknown field.
		js, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %v", meta.Kind, meta.Metadata.Name, err)
		}
		strictErrs, err := kjson.UnmarshalStrict(js, into)
		if err == nil && len(strictErrs) > 0 {
			err = errors.Join(strictErrs...)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s: %v", meta.Kind, meta.Metadata.Name, err)
		}
		out = append(out, object{meta.Kind, meta.Metadata.Name, into})
	}
	return out, nil
}

func TestKustomizeBuildsStrictlyValidObjects(t *testing.T) {
	t.Parallel()
	for _, dir := range []string{"k8s/base", "k8s/overlays/example"} {
		t.Run(dir, func(t *testing.T) {
			want := map[string]int{"Deployment": 2, "Service": 2, "NetworkPolicy": 2, "PodMonitor": 1, "PrometheusRule": 1}
			var stream []byte
			if dir == "k8s/overlays/example" {
				stream = renderExample(t)
				want["Secret"] = 1 // the secretGenerator's pdlink-auth-<hash>
			} else {
				stream = kustomizeBuild(t, dir)
			}
			objs, err := decodeStrict(stream)
			if err != nil {
				t.Fatal(err)
			}
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[o.kind]++
			}
			if !reflect.DeepEqual(kinds, want) {
				t.Errorf("objects %v, want %v", kinds, want)
			}
			if dir == "k8s/overlays/example" {
				checkPods(t, objs)
			}
		})
	}
}

// TestStrictDecodingRejectsMistakes proves the decoding above is strict.
func TestStrictDecodingRejectsMistakes(t *testing.T) {
	for _, tc := range []struct{ file, from, to string }{
		{"k8s/base/prefill.yaml", "restartPolicy: Always", "restartPolicyy: Always"},
		{"k8s/base/decode.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFileSystem: true"},
		{"k8s/base/podmonitor.yaml", "podMetricsEndpoints:", "podMetricEndpoints:"},
		{"k8s/base/networkpolicy.yaml", "policyTypes: [Ingress]", "policyType: [Ingress]"},
		{"k8s/base/prefill.yaml", "terminationGracePeriodSeconds: 75", "terminationGracePeriodSeconds: 75s"},
		{"k8s/base/services.yaml", "  clusterIP: None\n", "  clusterIP: None\n  clusterIP: None\n"},
	} {
		good := readFile(t, tc.file)
		bad := bytes.Replace(good, []byte(tc.from), []byte(tc.to), 1)
		if bytes.Equal(bad, good) {
			t.Fatalf("%q not in %s", tc.from, tc.file)
		}
		if _, err := decodeStrict(good); err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		if _, err := decodeStrict(bad); err == nil {
			t.Errorf("%s with %q decoded without error", tc.file, tc.to)
		}
	}
}

func env(c corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

func listenPort(t testing.TB, addr string) int32 {
	t.Helper()
	_, p, err := net.SplitHostPort(strings.TrimPrefix(addr, "tcp://"))
	if err != nil {
		t.Fatalf("listen address %q: %v", addr, err)
	}
	var n int32
	fmt.Sscan(p, &n)
	return n
}

func portByName(c corev1.Container, name string) int32 {
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	return 0
}

func mountVolume(c corev1.Container, path string) string {
	for _, m := range c.VolumeMounts {
		if m.MountPath == path {
			return m.Name
		}
	}
	return ""
}

// checkPods holds the built objects to the daemons' contract.
func checkPods(t testing.TB, objs []object) {
	pods := map[string]*corev1.PodTemplateSpec{}
	daemonPorts := map[string]map[string]int32{} // component -> port name -> number
	secrets := map[string]*corev1.Secret{}
	for _, o := range objs {
		if s, ok := o.obj.(*corev1.Secret); ok {
			secrets[s.Name] = s
		}
	}
	for _, o := range objs {
		d, ok := o.obj.(*appsv1.Deployment)
		if !ok {
			continue
		}
		comp := d.Spec.Template.Labels["app.kubernetes.io/component"]
		role := map[string]daemon.Role{"prefill": daemon.RolePrefill, "decode": daemon.RoleDecode}[comp]
		if role == "" {
			t.Fatalf("%s: component %q", d.Name, comp)
		}
		pods[comp] = &d.Spec.Template
		spec := d.Spec.Template.Spec
		if len(spec.InitContainers) != 1 || len(spec.Containers) != 1 {
			t.Fatalf("%s: want one daemon sidecar and one engine", d.Name)
		}
		side, engine := spec.InitContainers[0], spec.Containers[0]
		if side.Name != string(role) || side.RestartPolicy == nil || *side.RestartPolicy != corev1.ContainerRestartPolicyAlways {
			t.Errorf("%s: %s must be a native sidecar (restartPolicy: Always)", d.Name, side.Name)
		}
		if !strings.HasPrefix(side.Image, "registry.example.com/pdlink/pdlink:") ||
			!strings.HasPrefix(engine.Image, "registry.example.com/engines/") {
			t.Errorf("%s: overlay images not applied: %s, %s", d.Name, side.Image, engine.Image)
		}
		// Every PDLINK_* variable must be a flag: a misspelt one is ignored.
		// Others (POD_IP) only feed $(VAR) references.
		flags := flagEnvNames(role)
		for _, e := range side.Env {
			if _, ok := flags[e.Name]; !ok && strings.HasPrefix(e.Name, "PDLINK_") {
				t.Errorf("%s: %s is not a %s flag", d.Name, e.Name, role)
			}
		}
		// Service links would add <SERVICE>_PORT and the like for every
		// Service of the namespace: a Service named pdlink-... could set a
		// flag nobody wrote.
		if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
			t.Errorf("%s: want enableServiceLinks: false (the daemon's environment is what the manifest says)", d.Name)
		}
		checkTokenMount(t, d.Name, spec, side, engine, secrets)
		// The region directories and the socket directory: shared memory,
		// in both containers.
		vols := map[string]corev1.Volume{}
		for _, v := range spec.Volumes {
			vols[v.Name] = v
		}
		regionDirs := env(side, "PDLINK_REGION_DIR")
		if regionDirs == "" {
			t.Errorf("%s: no PDLINK_REGION_DIR: the daemon maps regions only from --region-dir (default %s)", d.Name, daemon.DefaultRegionDir)
		}
		for _, path := range append(strings.Split(regionDirs, ","), "/run/pdlink") {
			vs, ve := mountVolume(side, path), mountVolume(engine, path)
			if vs == "" || vs != ve {
				t.Errorf("%s: %s not shared by %s and engine (%q, %q)", d.Name, path, side.Name, vs, ve)
				continue
			}
			if ed := vols[vs].EmptyDir; ed == nil || ed.Medium != corev1.StorageMediumMemory {
				t.Errorf("%s: %s is not a memory-backed emptyDir", d.Name, path)
			}
		}
		if got, want := env(side, "PDLINK_GRPC_LISTEN"), "unix:///run/pdlink/"+string(role)+".sock"; got != want {
			t.Errorf("%s: PDLINK_GRPC_LISTEN=%q, want %q (in the shared socket directory)", d.Name, got, want)
		}
		// Probes on the metrics port, which is where --http-listen binds.
		metricsPort := portByName(side, "metrics")
		if metricsPort == 0 || metricsPort != listenPort(t, env(side, "PDLINK_HTTP_LISTEN")) {
			t.Errorf("%s: metrics port %d does not match PDLINK_HTTP_LISTEN %q", d.Name, metricsPort, env(side, "PDLINK_HTTP_LISTEN"))
		}
		for name, p := range map[string]*corev1.Probe{"startup": side.StartupProbe, "liveness": side.LivenessProbe, "readiness": side.ReadinessProbe} {
			want := "/healthz"
			if name == "readiness" {
				want = "/readyz"
			}
			if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != want || p.HTTPGet.Port != intstr.FromString("metrics") {
				t.Errorf("%s: %s probe must GET %s on port metrics", d.Name, name, want)
			}
		}
		peerPort, peerEnv := "bootstrap", "PDLINK_BOOTSTRAP_LISTEN"
		if role == daemon.RoleDecode {
			peerPort, peerEnv = "data", "PDLINK_DATA_LISTEN"
		}
		if n := portByName(side, peerPort); n == 0 || n != listenPort(t, env(side, peerEnv)) {
			t.Errorf("%s: port %s=%d does not match %s %q", d.Name, peerPort, n, peerEnv, env(side, peerEnv))
		}
		if role == daemon.RoleDecode {
			checkAdvertise(t, d.Name, side)
		}
		daemonPorts[comp] = map[string]int32{"metrics": metricsPort, peerPort: portByName(side, peerPort), "engine": portByName(engine, "engine")}
		// The grace period covers the engine's preStop, then the daemon's
		// drain (sidecars stop after the engine), plus a margin.
		drain, err := time.ParseDuration(env(side, "PDLINK_DRAIN_TIMEOUT"))
		if err != nil {
			drain = daemon.DefaultConfig(role).DrainTimeout
		}
		var preStop time.Duration
		if engine.Lifecycle != nil && engine.Lifecycle.PreStop != nil && engine.Lifecycle.PreStop.Sleep != nil {
			preStop = time.Duration(engine.Lifecycle.PreStop.Sleep.Seconds) * time.Second
		}
		grace := time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
		if grace < preStop+drain+10*time.Second {
			t.Errorf("%s: terminationGracePeriodSeconds %s < engine preStop %s + drain %s + 10s", d.Name, grace, preStop, drain)
		}
		sc := side.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil ||
			len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
			t.Errorf("%s: %s must drop all capabilities, forbid privilege escalation, read-only root", d.Name, side.Name)
		}
		if psc := spec.SecurityContext; psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.FSGroup == nil {
			t.Errorf("%s: pod must run as non-root with an fsGroup shared by engine and daemon", d.Name)
		}
	}
	for _, o := range objs {
		switch x := o.obj.(type) {
		case *corev1.Service:
			comp := x.Spec.Selector["app.kubernetes.io/component"]
			if x.Spec.ClusterIP != corev1.ClusterIPNone {
				t.Errorf("service %s: want headless (pods are addressed one by one)", x.Name)
			}
			for _, p := range x.Spec.Ports {
				if n := daemonPorts[comp][p.TargetPort.StrVal]; n == 0 || n != p.Port {
					t.Errorf("service %s: port %d targets %q, which the %s daemon does not expose as %d", x.Name, p.Port, p.TargetPort.StrVal, comp, p.Port)
				}
			}
		case *networkingv1.NetworkPolicy:
			checkNetworkPolicy(t, x, daemonPorts)
		case *monitoringv1.PodMonitor:
			for comp, pod := range pods {
				for k, v := range x.Spec.Selector.MatchLabels {
					if pod.Labels[k] != v {
						t.Errorf("podmonitor %s does not select the %s pod", x.Name, comp)
					}
				}
			}
			if len(x.Spec.PodMetricsEndpoints) != 1 || x.Spec.PodMetricsEndpoints[0].Port == nil || *x.Spec.PodMetricsEndpoints[0].Port != "metrics" {
				t.Errorf("podmonitor %s: want one endpoint on port metrics", x.Name)
			}
		case *monitoringv1.PrometheusRule:
			if len(x.Spec.Groups) != len(readRules(t).Groups) {
				t.Errorf("prometheusrule %s: %d groups, rule file has %d", x.Name, len(x.Spec.Groups), len(readRules(t).Groups))
			}
		}
	}
}

// checkNetworkPolicy: the peer port (bootstrap on prefill, data on decode)
// admits only the other side's pods; every port the pod serves is admitted
// from somewhere; no rule admits all ports.
func checkNetworkPolicy(t testing.TB, np *networkingv1.NetworkPolicy, ports map[string]map[string]int32) {
	comp := np.Spec.PodSelector.MatchLabels["app.kubernetes.io/component"]
	other, peerPort := "decode", "bootstrap"
	if comp == "decode" {
		other, peerPort = "prefill", "data"
	}
	if len(np.Spec.PolicyTypes) != 1 || np.Spec.PolicyTypes[0] != networkingv1.PolicyTypeIngress {
		t.Errorf("networkpolicy %s: want policyTypes [Ingress]", np.Name)
	}
	covered := map[int32]bool{}
	for _, r := range np.Spec.Ingress {
		if len(r.Ports) == 0 || len(r.From) == 0 {
			t.Errorf("networkpolicy %s: a rule admits all ports or all sources", np.Name)
		}
		for _, p := range r.Ports {
			if p.Port == nil {
				t.Errorf("networkpolicy %s: a rule admits all ports", np.Name)
				continue
			}
			covered[p.Port.IntVal] = true
			if p.Port.IntVal != ports[comp][peerPort] {
				continue
			}
			for _, f := range r.From {
				if f.NamespaceSelector != nil || f.IPBlock != nil || f.PodSelector == nil ||
					f.PodSelector.MatchLabels["app.kubernetes.io/component"] != other {
					t.Errorf("networkpolicy %s: %s port %d admits more than %s pods", np.Name, peerPort, p.Port.IntVal, other)
				}
			}
		}
	}
	for name, n := range ports[comp] {
		if !covered[n] {
			t.Errorf("networkpolicy %s: port %s (%d) is admitted from nowhere", np.Name, name, n)
		}
	}
}

// errRecorder counts Errorf calls instead of failing the test.
type errRecorder struct {
	*testing.T
	errs []string
}

func (r *errRecorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestPodChecksCatchMistakes proves checkPods fails on the mistakes it is
// for, applied to the base manifests (images set as the overlay would).
func TestPodChecksCatchMistakes(t *testing.T) {
	var base []byte
	for _, f := range []string{"prefill.yaml", "decode.yaml", "services.yaml", "networkpolicy.yaml", "podmonitor.yaml", "prometheusrule.yaml"} {
		base = append(append(base, readFile(t, "k8s/base/"+f)...), "\n---\n"...)
	}
	// What the overlay's secretGenerator adds (without the hash suffix).
	base = append(base, "apiVersion: v1\nkind: Secret\nmetadata:\n  name: pdlink-auth\ndata:\n  token: "+
		base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("x"), 44))+"\n"...)
	images := strings.NewReplacer("image: pdlink\n", "image: registry.example.com/pdlink/pdlink:v1\n",
		"image: engine-prefill\n", "image: registry.example.com/engines/prefill:v1\n",
		"image: engine-decode\n", "image: registry.example.com/engines/decode:v1\n")
	check := func(stream []byte) []string {
		objs, err := decodeStrict([]byte(images.Replace(string(stream))))
		if err != nil {
			t.Fatal(err)
		}
		r := &errRecorder{T: t}
		checkPods(r, objs)
		return r.errs
	}
	if errs := check(base); len(errs) > 0 {
		t.Fatalf("base manifests: %q", errs)
	}
	for _, tc := range []struct{ name, from, to string }{
		{"bootstrap open to a namespace", "component: decode\n      ports:\n        - port: 8998",
			"component: decode\n        - namespaceSelector: {}\n      ports:\n        - port: 8998"},
		{"grace shorter than the drain", "terminationGracePeriodSeconds: 75", "terminationGracePeriodSeconds: 30"},
		{"daemon not a sidecar", "          restartPolicy: Always\n", ""},
		{"misspelt variable", "name: PDLINK_DRAIN_TIMEOUT", "name: PDLINK_DRAIN_TIMEOUTS"},
		{"readiness on /healthz", "path: /readyz", "path: /healthz"},
		{"shm on disk", "emptyDir:\n            medium: Memory\n            sizeLimit: 64Gi", "emptyDir:\n            sizeLimit: 64Gi"},
		{"no region dir", "            - name: PDLINK_REGION_DIR\n              value: /dev/shm/pdlink\n", ""},
		{"region dir the engine does not mount", "            - name: pdlink-regions\n              mountPath: /dev/shm/pdlink\n            - name: pdlink-run\n              mountPath: /run/pdlink\n      volumes:", "            - name: pdlink-run\n              mountPath: /run/pdlink\n      volumes:"},
		{"metrics port off the listener", "value: 0.0.0.0:9400", "value: 0.0.0.0:9402"},
		{"no token file", "            - name: PDLINK_AUTH_TOKEN_FILE\n              value: /etc/pdlink/auth/token\n", ""},
		{"token mounted writable", "mountPath: /etc/pdlink/auth\n              readOnly: true", "mountPath: /etc/pdlink/auth\n              readOnly: false"},
		{"token readable by others", "defaultMode: 0440", "defaultMode: 0444"},
		{"token through a subPath", "mountPath: /etc/pdlink/auth\n", "mountPath: /etc/pdlink/auth\n              subPath: token\n"},
		{"token Secret missing", "secretName: pdlink-auth\n", "secretName: pdlink-auth-typo\n"},
		{"wildcard data listen advertised as is", "            - name: PDLINK_DATA_ADVERTISE\n              value: $(POD_IP):9500\n", ""},
		{"advertise not the pod IP", "fieldPath: status.podIP", "fieldPath: status.hostIP"},
		{"service links on", "enableServiceLinks: false", "enableServiceLinks: true"},
	} {
		bad := bytes.Replace(base, []byte(tc.from), []byte(tc.to), 1)
		if bytes.Equal(bad, base) {
			t.Fatalf("%s: %q not in the base", tc.name, tc.from)
		}
		if errs := check(bad); len(errs) == 0 {
			t.Errorf("%s: accepted", tc.name)
		}
	}
}

// checkTokenMount: the daemon reads PDLINK_AUTH_TOKEN_FILE from a key of a
// Secret in the stream, mounted read-only as a directory (a subPath mount
// never sees a Secret update), in a mode the daemon accepts (not readable or
// writable by others: the kubelet makes it root:fsGroup and adds 0440), and
// the engine does not mount it.
func checkTokenMount(t testing.TB, name string, spec corev1.PodSpec, side, engine corev1.Container, secrets map[string]*corev1.Secret) {
	path := env(side, "PDLINK_AUTH_TOKEN_FILE")
	if path == "" {
		t.Errorf("%s: %s has no PDLINK_AUTH_TOKEN_FILE: it refuses its non-loopback listeners without a shared secret", name, side.Name)
		return
	}
	var mount *corev1.VolumeMount
	for i, m := range side.VolumeMounts {
		if strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
			mount = &side.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Errorf("%s: PDLINK_AUTH_TOKEN_FILE %s is on no volume of %s", name, path, side.Name)
		return
	}
	if !mount.ReadOnly || mount.SubPath != "" || mount.SubPathExpr != "" {
		t.Errorf("%s: the token volume %s must be mounted read-only, as a directory (no subPath)", name, mount.Name)
	}
	var vol *corev1.SecretVolumeSource
	for _, v := range spec.Volumes {
		if v.Name == mount.Name {
			vol = v.Secret
		}
	}
	if vol == nil {
		t.Errorf("%s: the token volume %s is not a Secret", name, mount.Name)
		return
	}
	key := strings.TrimPrefix(path, strings.TrimSuffix(mount.MountPath, "/")+"/")
	mode := int32(corev1.SecretVolumeSourceDefaultMode)
	if vol.DefaultMode != nil {
		mode = *vol.DefaultMode
	}
	if len(vol.Items) > 0 {
		found := false
		for _, it := range vol.Items {
			if it.Path == key {
				key, found = it.Key, true
				if it.Mode != nil {
					mode = *it.Mode
				}
			}
		}
		if !found {
			t.Errorf("%s: the token volume %s has no item %s", name, mount.Name, key)
		}
	}
	if mode&0o007 != 0 {
		t.Errorf("%s: the token file mode %04o is open to other users (the daemon refuses o+w, warns on o+r): want 0440", name, mode)
	}
	sec := secrets[vol.SecretName]
	if sec == nil {
		t.Errorf("%s: the token Secret %s is not in the build", name, vol.SecretName)
	} else if _, ok := sec.Data[key]; !ok {
		if _, ok := sec.StringData[key]; !ok {
			t.Errorf("%s: Secret %s has no key %s", name, vol.SecretName, key)
		}
	}
	for _, m := range engine.VolumeMounts {
		if m.Name == mount.Name {
			t.Errorf("%s: the engine mounts the token volume %s: only the daemon needs the secret", name, m.Name)
		}
	}
}

// checkAdvertise: a decode daemon bound to a wildcard must advertise an
// address prefill daemons can dial, its pod IP from the downward API;
// otherwise it sends them the wildcard itself.
func checkAdvertise(t testing.TB, name string, side corev1.Container) {
	host, _, _ := net.SplitHostPort(env(side, "PDLINK_DATA_LISTEN"))
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return
	}
	adv := env(side, "PDLINK_DATA_ADVERTISE")
	podIP := ""
	for _, e := range side.Env {
		if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP" {
			podIP = e.Name
		}
	}
	want := fmt.Sprintf("$(%s):%d", podIP, portByName(side, "data"))
	if podIP == "" || (adv != want && adv != "["+strings.Replace(want, ":", "]:", 1)) {
		t.Errorf("%s: PDLINK_DATA_LISTEN is a wildcard and PDLINK_DATA_ADVERTISE is %q: want %s, the pod IP from the downward API", name, adv, want)
	}
}

// TestExampleTokenFileIsNotShipped: every file the example overlay's
// secretGenerator reads is ignored by git, so no checkout ships a secret
// and an operator's token is not committed by accident.
func TestExampleTokenFileIsNotShipped(t *testing.T) {
	var k struct {
		SecretGenerator []struct {
			Files []string `json:"files"`
		} `json:"secretGenerator"`
	}
	if err := yaml.Unmarshal(readFile(t, "k8s/overlays/example/kustomization.yaml"), &k); err != nil {
		t.Fatal(err)
	}
	ignored := map[string]bool{}
	for _, l := range strings.Split(string(readFile(t, "k8s/overlays/example/.gitignore")), "\n") {
		ignored[strings.TrimPrefix(strings.TrimSpace(l), "/")] = true
	}
	n := 0
	for _, g := range k.SecretGenerator {
		for _, f := range g.Files {
			_, src, ok := strings.Cut(f, "=")
			if !ok {
				src = f
			}
			n++
			if !ignored[src] {
				t.Errorf("secretGenerator file %s is not in k8s/overlays/example/.gitignore", src)
			}
			if "k8s/overlays/example/"+src != exampleTokenFile {
				t.Errorf("secretGenerator file %s: the tests write %s", src, exampleTokenFile)
			}
		}
	}
	if n == 0 {
		t.Error("the example overlay generates no Secret from a file")
	}
}
