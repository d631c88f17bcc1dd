package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// podAPIReport is what e2e/podapiclient writes each round: per path, the
// status code and the names of what it got.
type podAPIReport struct {
	Host    string `json:"host"`
	Round   int    `json:"round"`
	Answers map[string]struct {
		Code  int      `json:"code"`
		Names []string `json:"names"`
		Err   string   `json:"err"`
	} `json:"answers"`
}

// TestPodAPI: pods' own API access through tether-edge (issue 31, item
// 3). edge-1 runs a full kubelet and tether-edge with --pod-api-listen
// :10268 and a serving certificate from the cluster CA (the pods'
// ca.crt, kube-root-ca.crt, which the admin writes: no
// kube-controller-manager publishes it here). Two pods run a static
// client-go program with in-cluster config: the kubelet gave them the
// pod listener as KUBERNETES_SERVICE_HOST/PORT. Pod a (service account
// reader, which may read ConfigMaps and no Secret) lists ConfigMaps and
// gets a Secret its own pod mounts, as User-Agent kubelet; pod b
// (service account other) gets one ConfigMap. Online they are answered
// by the cloud with their own tokens; with the site cut, a gets the same
// list from the cache and still no Secret, and b gets 503 for the list
// only a read.
func TestPodAPI(t *testing.T) {
	testenv.RequireRoot(t)
	w := world.New(t, bins, world.Options{RealKubelets: []string{"edge-1"}, PodCIDRs: true}, t.Logf)
	edge := w.Edge("edge-1")
	// The test's pod network gives pods a route to their own range only
	// (the bridge, no default route): the pods dial the node's address on
	// the bridge (cni0, the range's first address), which
	// --pod-api-address names and the certificate holds.
	bridge := edge.PodCIDR.Masked().Addr().Next()
	kp, err := w.ClusterCA.ServerCert(edge.Name, bridge.String(), edge.Host.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := kp.WriteFiles(w.Dir, edge.Name+"-pod-api")
	if err != nil {
		t.Fatal(err)
	}
	w.StartEdge(t, edge, append(w.ProxyArgs(edge), "--pod-api-listen", ":10268", "--pod-api-cert", cert, "--pod-api-key", key,
		"--pod-api-address", bridge.String())...)
	w.StartRealKubelet(t, edge, world.RealKubeletOptions{})

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	const ns = "podapi"
	admin := w.CP.Client
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	meta := func(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name, Namespace: ns} }
	must(admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}))
	must(admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: meta("kube-root-ca.crt"),
		Data: map[string]string{"ca.crt": string(w.ClusterCA.CertPEM)}}, metav1.CreateOptions{}))
	for _, cm := range []string{"cm-a", "cm-b"} {
		must(admin.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: meta(cm), Data: map[string]string{"k": cm}}, metav1.CreateOptions{}))
	}
	must(admin.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: meta("kubelet-only"), StringData: map[string]string{"password": "p"}}, metav1.CreateOptions{}))
	must(admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: meta("cm-reader"),
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "list", "watch"}}}},
		metav1.CreateOptions{}))
	for _, sa := range []string{"reader", "other"} {
		must(admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: meta(sa)}, metav1.CreateOptions{}))
		must(admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: meta(sa),
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "cm-reader"},
			Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}}}, metav1.CreateOptions{}))
	}

	dir := t.TempDir()
	build := exec.CommandContext(ctx, "go", "build", "-o", filepath.Join(dir, "podapiclient"), "./podapiclient")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the pods' client: %v\n%s", err, out)
	}
	os.Chmod(dir, 0o777)
	list := "/api/v1/namespaces/" + ns + "/configmaps"
	secret := "/api/v1/namespaces/" + ns + "/secrets/kubelet-only"
	cmB := list + "/cm-b"
	setPaths := func(pod string, paths ...string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, pod+".paths"), []byte(strings.Join(paths, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	setPaths("a", list, secret)
	setPaths("b", cmB)
	startPod := func(name, sa string, extra ...string) {
		t.Helper()
		pod := &corev1.Pod{ObjectMeta: meta(name), Spec: corev1.PodSpec{
			NodeName: edge.Name, ServiceAccountName: sa, DNSPolicy: corev1.DNSDefault, TerminationGracePeriodSeconds: ptr.To[int64](1),
			Volumes: []corev1.Volume{
				{Name: "bin", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}}},
				// The kubelet reads this Secret (as the node) to mount it.
				{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "kubelet-only"}}},
			},
			Containers: []corev1.Container{{
				Name: "client", Image: testenv.BusyboxImage, ImagePullPolicy: corev1.PullNever,
				Command:      append([]string{"/bin/podapiclient", "--paths", "/bin/" + name + ".paths", "--out", "/bin/" + name + ".json"}, extra...),
				VolumeMounts: []corev1.VolumeMount{{Name: "bin", MountPath: "/bin"}, {Name: "secret", MountPath: "/secret", ReadOnly: true}},
			}},
		}}
		// busybox's own /bin is hidden by the mount: the client needs none of it.
		must(admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}))
	}
	startPod("a", "reader", "--user-agent", "kubelet/v1.36.3 (linux/amd64) kubernetes/abc")
	startPod("b", "other")

	read := func(pod string) (podAPIReport, error) {
		var r podAPIReport
		b, err := os.ReadFile(filepath.Join(dir, pod+".json"))
		if err != nil {
			return r, err
		}
		return r, json.Unmarshal(b, &r)
	}
	// await waits for a round of pod's after round since whose answer
	// to path has code and, if names is not nil, those names.
	await := func(what, pod string, since int, path string, code int, names []string) int {
		t.Helper()
		var last podAPIReport
		var round int
		testenv.EventuallyNoError(t, what, func() error {
			r, err := read(pod)
			if err != nil {
				return err
			}
			last = r
			a, ok := r.Answers[path]
			switch {
			case r.Round <= since || !ok:
				return fmt.Errorf("round %d of pod %s (want one after %d with %s)", r.Round, pod, since, path)
			case a.Code == 200 && path == secret:
				t.Fatalf("pod %s got the Secret the kubelet reads: %+v", pod, r)
			case a.Code != code:
				return fmt.Errorf("pod %s, %s: %d %v %s, want %d", pod, path, a.Code, a.Names, a.Err, code)
			case names != nil && !slices.Equal(a.Names, names):
				return fmt.Errorf("pod %s, %s: names %v, want %v", pod, path, a.Names, names)
			}
			round = r.Round
			return nil
		})
		t.Logf("%s: pod %s round %d: %+v", what, pod, round, last.Answers)
		return round
	}
	metric := func(series string) float64 {
		t.Helper()
		m, err := world.Get(ctx, edge.Host, world.EdgeAdmin("/metrics"))
		if err != nil {
			t.Fatalf("metrics of %s: %v", edge.Name, err)
		}
		return world.Metric(m, series)
	}
	names := []string{"cm-a", "cm-b", "kube-root-ca.crt"}

	// Online.
	testenv.EventuallyWithin(t, 3*time.Minute, "pod a's first report", func() bool { _, err := read("a"); return err == nil })
	r, _ := read("a")
	if want := fmt.Sprintf("https://%s:10268", bridge); r.Host != want {
		t.Fatalf("the pod's in-cluster config dials %s, want the pod listener %s (KUBERNETES_SERVICE_HOST/PORT from the kubelet)", r.Host, want)
	}
	roundA := await("pod a lists ConfigMaps with its own token online", "a", 0, list, 200, names)
	roundA = await("pod a, saying it is the kubelet, is refused the Secret by the cloud", "a", roundA, secret, 403, nil)
	roundB := await("pod b gets cm-b online", "b", 0, cmB, 200, []string{"cm-b"})
	if n := metric(`tether_edge_pod_api_requests_total{served="cloud"}`); n < 3 {
		t.Errorf("pod requests the cloud answered through :10268: %v", n)
	}

	// The site is cut. Once pod a is refused the Secret with 503 (the
	// edge answers offline), its next rounds' lists come from the cache.
	edge.Site.Cut()
	t.Cleanup(edge.Site.Heal)
	t.Run("ForgedUserAgent", func(t *testing.T) {
		roundA = await("pod a, saying it is the kubelet, refused the Secret offline", "a", roundA, secret, 503, nil)
	})
	t.Run("Offline", func(t *testing.T) {
		cached := metric(`tether_edge_pod_api_requests_total{served="cache"}`)
		await("pod a's list from the cache, site cut", "a", roundA, list, 200, names)
		if n := metric(`tether_edge_pod_api_requests_total{served="cache"}`); n <= cached {
			t.Errorf("pod requests served from the cache: %v, had %v", n, cached)
		}
		// A round of b's that starts after the edge answered a offline.
		if r, err := read("b"); err == nil && r.Round > roundB {
			roundB = r.Round
		}
		roundB = await("pod b's own get from the cache", "b", roundB, cmB, 200, []string{"cm-b"})
		setPaths("b", cmB, list)
		await("pod b refused pod a's list offline", "b", roundB, list, 503, nil)
	})
}
