package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// rebootStatic is the static pod's name in its manifest; the kubelet
// names it, and its mirror pod, after the node too.
const rebootStatic = "shop-clock"

// TestRealKubeletReboot takes a node with a full kubelet, containerd and
// real containers behind tether-edge through a power cut with the uplink
// down: the site is cut, then the kubelet, tether-edge, containerd and
// every container are killed (SIGKILL) and the runtime's tmpfs state
// wiped as a reboot does, and all start again while still offline. Every
// pod runs again on the node — pods whose containers check their
// ConfigMap, Secret, env, downward API and service-account token volumes
// (the token the cloud issued before the cut, served by tether-edge), and
// a static pod. After the heal the node is Ready, the same pods run under
// the same UIDs, the status writes made offline are accounted for and the
// events the kubelet made offline are counted as refused.
func TestRealKubeletReboot(t *testing.T) {
	testenv.RequireRoot(t)
	opts := kubeletSite()
	opts.RealKubelets = []string{"edge-1"}
	w := world.New(t, bins, opts, t.Logf)
	w.ApplyEdgeRBAC(t)
	w.CP.StartControllerManager(t, testenv.ControllerManagerOptions{NodeMonitorGracePeriod: 12 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	admin := w.CP.Client
	e := w.Edges[0]

	w.StartGateway(t, w.Gateways[0])
	w.RouteSitesVia(t, w.Gateways[0])
	// The default --cache-components includes kubelet.
	edgeArgs := w.ProxyArgs(e)
	w.StartEdge(t, e, edgeArgs...)
	k := w.StartRealKubelet(t, e, world.RealKubeletOptions{})

	// Each container appends a line to a file of its own on the node's
	// disk when it starts: "ok <sha256 of its token>" once its checks
	// pass, "fail <what>" otherwise.
	checks := w.Path("reboot-checks")
	if err := os.MkdirAll(checks, 0o777); err != nil {
		t.Fatal(err)
	}
	const pods = 3
	uids, err := world.CreateWorkload(ctx, admin, w.CP.CA.CertPEM, world.WorkloadOptions{Namespace: "shop", Node: e.Name})
	if err != nil {
		t.Fatal(err)
	}
	for i := range pods {
		p, err := admin.CoreV1().Pods("shop").Create(ctx, checkedPod(fmt.Sprintf("till-%02d", i), e.Name, checks), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uids[p.Name] = p.UID
	}
	writeStaticPod(t, k.ManifestDir, checks)
	static := rebootStatic + "-" + e.Name

	waitPodsRunning(t, ctx, admin, "shop", uids)
	var mirror *corev1.Pod
	testenv.EventuallyNoError(t, "the mirror pod of "+static+" Running", func() error {
		p, err := admin.CoreV1().Pods("shop").Get(ctx, static, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		mirror = p
		return nil
	})
	// On the node the static pod has the UID the kubelet gave it, which
	// its mirror pod carries in an annotation.
	onNode := map[string]types.UID{"shop/" + static: types.UID(mirror.Annotations[corev1.MirrorPodAnnotationKey])}
	for name, uid := range uids {
		onNode["shop/"+name] = uid
	}
	waitRealKubeletRuns(t, ctx, k, onNode)
	tokens := waitChecks(t, checks, slices.Collect(maps.Keys(uids)), 1)
	waitChecks(t, checks, []string{static}, 1)
	t.Logf("online: %d pods and the static pod %s Running on %s, their checks passed", len(uids), static, e.Name)

	// The power cut: the uplink is down, and the node goes down with
	// everything on it.
	e.CutUplink(t)
	if err := k.PowerCut(); err != nil {
		t.Fatal(err)
	}
	if err := w.Kill(e.Host); err != nil {
		t.Logf("tether-edge killed: %v", err)
	}
	w.StartEdge(t, e, edgeArgs...)
	started := time.Now()
	k = k.Boot(t)
	waitRealKubeletRuns(t, ctx, k, onNode)
	after := waitChecks(t, checks, slices.Collect(maps.Keys(uids)), 2)
	waitChecks(t, checks, []string{static}, 2)
	t.Logf("offline reboot: all %d pods and the static pod run again, their checks passed, %v after the kubelet started",
		len(uids), time.Since(started).Round(100*time.Millisecond))
	for name, sum := range after {
		if sum != tokens[name] {
			t.Errorf("pod %s mounted a token (sha256 %s) offline other than the one the cloud issued (%s)", name, sum, tokens[name])
		}
	}

	// Offline, tether-edge answered every pod's TokenRequest with the
	// token the cloud issued, and refused the events the kubelet made.
	metrics, err := world.Get(ctx, e.Host, world.EdgeAdmin("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	if n := world.Metric(metrics, `tether_edge_apiserver_tokens_served_offline_total{component="kubelet"}`); n < pods {
		t.Errorf("tether-edge served %v tokens offline, want at least %d", n, pods)
	}
	refused := world.Metric(metrics, `tether_edge_apiserver_requests_total{component="kubelet",served="refused",verb="create"}`)
	if refused == 0 {
		t.Errorf("no create of the kubelet refused offline: the events it made on starting its pods are not counted")
	}
	t.Logf("offline: creates of the kubelet refused (events, counted as dropped): %v", refused)
	for _, l := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(l, `tether_edge_apiserver_requests_total{component="kubelet"`) {
			t.Logf("offline: %s", l)
		}
	}

	// The outage lasts long enough for kube-controller-manager to mark
	// the node Unknown, as any real one does.
	testenv.Eventually(t, "kube-controller-manager marks "+e.Name+" not Ready", func() bool {
		return !nodeReady(t, ctx, admin, e.Name)
	})
	if k.Exited() {
		t.Fatalf("the kubelet exited offline:\n%s", tailLines(k.Log(), 40))
	}

	e.HealUplink(t)
	healed := time.Now()
	testenv.Eventually(t, e.Name+" Ready again after the heal", func() bool { return nodeReady(t, ctx, admin, e.Name) })
	t.Logf("heal: %s Ready %v after the uplink came back", e.Name, time.Since(healed).Round(100*time.Millisecond))

	// Nothing lost or repeated: the same pods and mirror pod, never
	// deleted or made again, and every status write made offline
	// accounted for.
	waitPodsRunning(t, ctx, admin, "shop", uids)
	list, err := admin.CoreV1().Pods("shop").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != len(uids)+1 {
		t.Errorf("%d pods in shop after the heal, want the %d made before the outage and the mirror pod", len(list.Items), len(uids))
	}
	for _, p := range list.Items {
		want := uids[p.Name]
		if p.Name == static {
			want = mirror.UID
		}
		if p.DeletionTimestamp != nil || want != p.UID {
			t.Errorf("pod %s after the heal: uid %s (was %s), deletion %v", p.Name, p.UID, want, p.DeletionTimestamp)
		}
	}
	waitRealKubeletRuns(t, ctx, k, onNode)
	waitLedgerDrained(t, ctx, e)
}

// checkScript is what a checked pod's container runs: it checks its
// ConfigMap, Secret and downward API volumes, its env and its
// service-account token, appends the result to /checks/<pod name> and
// sleeps.
const checkScript = `tok=/var/run/secrets/kubernetes.io/serviceaccount/token
out=/checks/$(hostname)
fail() { echo "fail $*" >> $out; exit 1; }
test -s $tok || fail no token
test "$(cat /etc/till/mode)" = offline-first || fail configmap volume
test "$(cat /etc/till-secret/password)" = shop-till || fail secret volume
test "$MODE $PASSWORD" = "offline-first shop-till" || fail env
grep -q 'app="till"' /etc/podinfo/labels || fail downward api volume
echo "ok $(sha256sum $tok | cut -d' ' -f1)" >> $out
exec sleep 2147483647
`

// checkedPod is a pod of the workload (ConfigMap, Secret, downward API and
// the default service-account token volumes) whose busybox container
// checks them (checkScript), writing to dir on the node.
func checkedPod(name, node, dir string) *corev1.Pod {
	p := world.WorkloadPod(name, world.WorkloadOptions{Namespace: "shop", Node: node})
	p.Spec.AutomountServiceAccountToken = nil // the default: mounted
	p.Spec.Tolerations = nil
	p.Spec.DNSPolicy = corev1.DNSDefault
	p.Spec.TerminationGracePeriodSeconds = ptr.To[int64](1)
	c := &p.Spec.Containers[0]
	c.Image, c.ImagePullPolicy = testenv.BusyboxImage, corev1.PullNever
	c.Command = []string{"sh", "-c", checkScript}
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "checks", MountPath: "/checks"})
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "checks",
		VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}}})
	return p
}

// writeStaticPod writes the manifest of a static pod whose busybox
// container appends "ok -" to dir/<its name> and sleeps (a static pod
// may refer to no API object: no token, ConfigMap or Secret).
func writeStaticPod(t *testing.T, manifests, dir string) {
	t.Helper()
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: rebootStatic, Namespace: "shop"},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  ptr.To(false),
			DNSPolicy:                     corev1.DNSDefault,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "clock", Image: testenv.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:      []string{"sh", "-c", `echo "ok -" >> /checks/$(hostname); exec sleep 2147483647`},
				VolumeMounts: []corev1.VolumeMount{{Name: "checks", MountPath: "/checks"}},
			}},
			Volumes: []corev1.Volume{{Name: "checks", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}}}},
		},
	}
	b, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(manifests, rebootStatic+".json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// waitChecks waits until each pod's container has started n times in all
// with its checks passed (n lines "ok <token sum>" in dir/<pod>), and
// returns the token sum of each pod's last start. A failed check fails
// the test.
func waitChecks(t *testing.T, dir string, pods []string, n int) map[string]string {
	t.Helper()
	sums := map[string]string{}
	testenv.EventuallyNoError(t, fmt.Sprintf("the containers of %d pods started %d times with their checks passed", len(pods), n), func() error {
		var short []string
		for _, name := range pods {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil && !os.IsNotExist(err) {
				return err
			}
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if len(b) == 0 {
				lines = nil
			}
			for _, l := range lines {
				kind, sum, _ := strings.Cut(l, " ")
				if kind != "ok" {
					t.Fatalf("a container of pod %s failed its checks: %q", name, l)
				}
				sums[name] = sum
			}
			if len(lines) < n {
				short = append(short, fmt.Sprintf("%s (%d)", name, len(lines)))
			}
		}
		if len(short) > 0 {
			slices.Sort(short)
			return fmt.Errorf("started fewer times: %v", short)
		}
		return nil
	})
	return sums
}

// waitRealKubeletRuns waits until the kubelet's runtime runs every pod,
// by namespace/name and UID.
func waitRealKubeletRuns(t *testing.T, ctx context.Context, k *world.RealKubelet, want map[string]types.UID) {
	t.Helper()
	testenv.EventuallyNoError(t, fmt.Sprintf("the kubelet of %s runs %d pods", k.Edge.Name, len(want)), func() error {
		if k.Exited() {
			t.Fatalf("the kubelet of %s exited:\n%s", k.Edge.Name, tailLines(k.Log(), 40))
		}
		running, err := k.RunningPods(ctx)
		if err != nil {
			return err
		}
		var missing []string
		for name, uid := range want {
			if running[name] != uid {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			slices.Sort(missing)
			return fmt.Errorf("not running: %v (running: %v)", missing, slices.Sorted(maps.Keys(running)))
		}
		return nil
	})
}
