package deploy

import (
	"crypto/rand"
	"encoding/base64"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// renderOverlay builds overlay (under deploy/k8s/overlays) from a copy of deploy/k8s with a
// fresh example token file.
func renderOverlay(t *testing.T, overlay string) []byte {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "k8s")
	if err := os.CopyFS(dir, os.DirFS("k8s")); err != nil {
		t.Fatal(err)
	}
	token := make([]byte, 48)
	_, _ = rand.Read(token)
	path := filepath.Join(dir, strings.TrimPrefix(exampleTokenFile, "k8s/"))
	if err := os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(token)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return kustomizeBuild(t, filepath.Join(dir, "overlays", overlay))
}

// TestSameNodeOverlayMapsOneRegionDirInBothPods: the same-node overlay renders strictly
// valid objects; both Deployments mount one hostPath /dev/shm/pdlink at the same path in
// every container that mounts the regions (decoded opens the path prefill advertises),
// decode pods require a prefill pod on their node, and the NetworkPolicies are the
// example's, unchanged.
func TestSameNodeOverlayMapsOneRegionDirInBothPods(t *testing.T) {
	t.Parallel()
	same, err := decodeStrict(renderOverlay(t, "same-node"))
	if err != nil {
		t.Fatal(err)
	}
	example, err := decodeStrict(renderOverlay(t, "example"))
	if err != nil {
		t.Fatal(err)
	}
	policies := func(objs []object) map[string]networkingv1.NetworkPolicySpec {
		out := map[string]networkingv1.NetworkPolicySpec{}
		for _, o := range objs {
			if np, ok := o.obj.(*networkingv1.NetworkPolicy); ok {
				out[o.name] = np.Spec
			}
		}
		return out
	}
	if got, want := policies(same), policies(example); len(want) == 0 || !reflect.DeepEqual(got, want) {
		t.Errorf("same-node NetworkPolicies differ from the example's:\n%v\nwant\n%v", got, want)
	}
	deployments := 0
	for _, o := range same {
		d, ok := o.obj.(*appsv1.Deployment)
		if !ok {
			continue
		}
		deployments++
		spec := d.Spec.Template.Spec
		found := false
		for _, v := range spec.Volumes {
			if v.Name != "pdlink-regions" {
				continue
			}
			found = true
			if v.HostPath == nil || v.HostPath.Path != "/dev/shm/pdlink" || v.EmptyDir != nil {
				t.Errorf("%s: regions volume %+v, want only hostPath /dev/shm/pdlink", d.Name, v.VolumeSource)
			}
		}
		if !found {
			t.Errorf("%s: no pdlink-regions volume", d.Name)
		}
		for _, c := range append(append(spec.InitContainers[:0:0], spec.InitContainers...), spec.Containers...) {
			for _, m := range c.VolumeMounts {
				if m.Name == "pdlink-regions" && m.MountPath != "/dev/shm/pdlink" {
					t.Errorf("%s/%s mounts the regions at %s: the advertised path would name another file", d.Name, c.Name, m.MountPath)
				}
			}
		}
		if strings.HasSuffix(d.Name, "decode") {
			a := spec.Affinity
			if a == nil || a.PodAffinity == nil || len(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution) != 1 ||
				a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].TopologyKey != "kubernetes.io/hostname" ||
				a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution[0].LabelSelector.MatchLabels["app.kubernetes.io/component"] != "prefill" {
				t.Errorf("%s: affinity %+v, want a required prefill pod on the same hostname", d.Name, a)
			}
		}
	}
	if deployments != 2 {
		t.Fatalf("%d Deployments, want 2", deployments)
	}
}
