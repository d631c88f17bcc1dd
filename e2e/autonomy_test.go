package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/testenv"
)

// autonomyTolerationSeconds is what the apiserver's DefaultTolerationSeconds
// admission gives every pod here (300 s in a cluster's defaults).
const autonomyTolerationSeconds = 5

// TestAutonomy cuts two edge nodes, each running the kubelet's own code
// (kubemark's hollow kubelet) behind tether-edge, from the cloud with the
// real kube-controller-manager's node lifecycle and taint eviction
// controllers running: both nodes go unreachable and are tainted. The pods
// of edge-2, without the autonomy annotation, are evicted as upstream
// Kubernetes evicts them, once their default toleration runs out; those of
// edge-1, annotated node.beta.openyurt.io/autonomy: "true", stay bound,
// neither deleted nor terminating, well past that bound, and after the
// heal its kubelet still runs them under the same UIDs. Without the
// annotation, a second outage evicts them as upstream does.
func TestAutonomy(t *testing.T) {
	secs := fmt.Sprint(autonomyTolerationSeconds)
	w := world.New(t, bins, world.Options{APIServerArgs: []string{
		"--default-not-ready-toleration-seconds=" + secs, "--default-unreachable-toleration-seconds=" + secs,
	}}, t.Logf)
	w.ApplyEdgeRBAC(t)
	cm := w.CP.StartControllerManager(t, testenv.ControllerManagerOptions{
		Controllers: []string{testenv.NodeLifecycleController, "taint-eviction-controller"},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	admin := w.CP.Client
	lone, plain := w.Edge("edge-1"), w.Edge("edge-2")
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{openyurt.AutonomyAnnotation: "true"}}})
	if _, err := admin.CoreV1().Nodes().Patch(ctx, lone.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// A cloud node that stays Ready: with every node of the cluster
	// NotReady, the node lifecycle controller assumes the control plane
	// itself is cut, untaints them all and evicts nothing.
	keepReady(t, ctx, admin, "cloud-1", 2*time.Second)
	w.StartGateway(t, w.Gateways[0])
	w.RouteSitesVia(t, w.Gateways[0])
	kubelets := map[string]*world.HollowKubelet{}
	for _, e := range w.Edges {
		w.StartEdge(t, e, append(w.ProxyArgs(e), "--cache-components", world.HollowComponents)...)
		kubelets[e.Name] = w.StartHollowKubelet(t, e, false)
	}
	if err := w.WaitReachable(ctx, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	// The nodes carry no NoExecute taint before the pods come: a pod bound
	// to a node tainted already would be evicted before the gateway could
	// act. Pods bound before the kubelet posted the node's capacity would
	// be refused (OutOfpods).
	for _, e := range w.Edges {
		waitUntil(t, cm.Options.NodeMonitorGracePeriod+60*time.Second, e.Name+" Ready without NoExecute taints", func() bool {
			n, err := admin.CoreV1().Nodes().Get(ctx, e.Name, metav1.GetOptions{})
			return err == nil && nodeReady(t, ctx, admin, e.Name) && noExecuteTaint(n) == ""
		})
	}

	const ns = "autonomy"
	pods := map[string][]string{}
	uids := map[string]map[string]types.UID{}
	createNamespace(t, ctx, admin, ns)
	for _, e := range w.Edges {
		for i := range 3 {
			name := fmt.Sprintf("%s-%d", e.Name, i)
			p, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: corev1.PodSpec{NodeName: e.Name, AutomountServiceAccountToken: ptr.To(false),
					Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/none"}}},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pods[e.Name] = append(pods[e.Name], name)
			if uids[e.Name] == nil {
				uids[e.Name] = map[string]types.UID{}
			}
			uids[e.Name][name] = p.UID
		}
	}
	for _, e := range w.Edges {
		waitKubeletRuns(t, ctx, kubelets[e.Name], ns, uids[e.Name])
	}
	// The gateway makes edge-1's pods tolerate its loss forever; edge-2's
	// keep the admission's bound.
	waitUntil(t, 60*time.Second, "edge-1's pods tolerating unreachable and not-ready forever", func() bool {
		for _, name := range pods[lone.Name] {
			p, err := admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || tolerationBound(p, corev1.TaintNodeUnreachable) != nil || tolerationBound(p, corev1.TaintNodeNotReady) != nil {
				return false
			}
		}
		return true
	})
	for _, name := range pods[plain.Name] {
		p, err := admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if b := tolerationBound(p, corev1.TaintNodeUnreachable); b == nil || *b != autonomyTolerationSeconds {
			t.Fatalf("%s (edge-2, not autonomous) tolerates unreachable for %v, want the default %d s", name, ptrString(b), autonomyTolerationSeconds)
		}
	}

	// The outage: neither node renews its Lease.
	cutAt := time.Now()
	lone.CutUplink(t)
	plain.CutUplink(t)
	bound := cm.Options.NodeMonitorGracePeriod + autonomyTolerationSeconds*time.Second + 60*time.Second
	for _, e := range w.Edges {
		waitUntil(t, bound, e.Name+" tainted NoExecute", func() bool {
			n, err := admin.CoreV1().Nodes().Get(ctx, e.Name, metav1.GetOptions{})
			return err == nil && noExecuteTaint(n) != ""
		})
	}
	waitUntil(t, bound, "edge-2's pods evicted", func() bool {
		for _, name := range pods[plain.Name] {
			if !evicted(t, ctx, admin, ns, name) {
				return false
			}
		}
		return true
	})
	t.Logf("edge-2's pods evicted %v after the cut", time.Since(cutAt).Round(time.Second))

	// edge-1 is tainted (above): its pods' eviction, were it to come, is
	// due 5 s after that. A pod bound to tainted edge-2 now, tolerating
	// the taints for four times that, is evicted well after it.
	if _, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sentinel"},
		Spec: corev1.PodSpec{NodeName: plain.Name, AutomountServiceAccountToken: ptr.To(false),
			Containers:  []corev1.Container{{Name: "c", Image: "registry.invalid/none"}},
			Tolerations: withBound(4 * autonomyTolerationSeconds)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Never(t, "a pod of autonomous edge-1 evicted", func() bool {
		for _, name := range pods[lone.Name] {
			if evicted(t, ctx, admin, ns, name) {
				return true
			}
		}
		return false
	}, func() bool { return evicted(t, ctx, admin, ns, "sentinel") })
	n, err := admin.CoreV1().Nodes().Get(ctx, lone.Name, metav1.GetOptions{})
	if err != nil || noExecuteTaint(n) == "" {
		t.Fatalf("edge-1 lost its NoExecute taint during the watch (%v): the watch proved nothing", err)
	}
	t.Logf("edge-1's pods still bound %v after the cut, under %s", time.Since(cutAt).Round(time.Second), noExecuteTaint(n))

	// The heal: edge-1's kubelet, which ran its pods all along, finds them
	// still bound to it, and keeps running them.
	lone.HealUplink(t)
	waitUntil(t, 60*time.Second, "edge-1 Ready again after the heal", func() bool { return nodeReady(t, ctx, admin, lone.Name) })
	waitPodsRunning(t, ctx, admin, ns, uids[lone.Name])
	waitKubeletRuns(t, ctx, kubelets[lone.Name], ns, uids[lone.Name])
	for _, name := range pods[lone.Name] {
		if evicted(t, ctx, admin, ns, name) {
			t.Errorf("%s of autonomous edge-1 deleted or terminating after the heal", name)
		}
	}

	// The operator takes autonomy away: the pods tolerate what they did
	// before, and the next outage evicts them as upstream Kubernetes does.
	patch, _ = json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]any{openyurt.AutonomyAnnotation: nil}}})
	if _, err := admin.CoreV1().Nodes().Patch(ctx, lone.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 60*time.Second, "edge-1's pods back to the default toleration", func() bool {
		for _, name := range pods[lone.Name] {
			p, err := admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false
			}
			if b := tolerationBound(p, corev1.TaintNodeUnreachable); b == nil || *b != autonomyTolerationSeconds {
				return false
			}
		}
		return true
	})
	lone.CutUplink(t)
	waitUntil(t, bound, "edge-1's pods evicted in an outage once autonomy is off", func() bool {
		for _, name := range pods[lone.Name] {
			if !evicted(t, ctx, admin, ns, name) {
				return false
			}
		}
		return true
	})
}

// keepReady marks the Node name Ready every period until the test ends.
func keepReady(t *testing.T, ctx context.Context, c kubernetes.Interface, name string, period time.Duration) {
	t.Helper()
	markReady(t, ctx, c, name)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if err := world.MarkReady(ctx, c, name); err != nil && ctx.Err() == nil {
					t.Logf("mark %s Ready: %v", name, err)
				}
			}
		}
	}()
}

// withBound tolerates the unreachable and not-ready NoExecute taints for
// secs seconds.
func withBound(secs int64) []corev1.Toleration {
	var ts []corev1.Toleration
	for _, key := range []string{corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable} {
		ts = append(ts, corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To(secs)})
	}
	return ts
}

// createNamespace makes ns and its default ServiceAccount (no service
// account controller runs).
func createNamespace(t *testing.T, ctx context.Context, c kubernetes.Interface, ns string) {
	t.Helper()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// noExecuteTaint names n's unreachable or not-ready NoExecute taint, or
// is "".
func noExecuteTaint(n *corev1.Node) string {
	for _, tt := range n.Spec.Taints {
		if tt.Effect == corev1.TaintEffectNoExecute && (tt.Key == corev1.TaintNodeUnreachable || tt.Key == corev1.TaintNodeNotReady) {
			return tt.ToString()
		}
	}
	return ""
}

// tolerationBound is the tolerationSeconds of p's NoExecute toleration of
// key, nil when it has none (forever); a pod without one gets 0 (evicted at
// once).
func tolerationBound(p *corev1.Pod, key string) *int64 {
	for _, tt := range p.Spec.Tolerations {
		if tt.Key == key && tt.Effect == corev1.TaintEffectNoExecute {
			return tt.TolerationSeconds
		}
	}
	return ptr.To[int64](0)
}

func ptrString(p *int64) string {
	if p == nil {
		return "ever"
	}
	return fmt.Sprintf("%d s", *p)
}

// evicted reports whether the pod is gone or being deleted (on a node
// that cannot confirm, a deleted pod stays terminating).
func evicted(t *testing.T, ctx context.Context, c kubernetes.Interface, ns, name string) bool {
	t.Helper()
	p, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return true
	}
	if err != nil {
		t.Fatalf("get pod %s: %v", name, err)
	}
	return p.DeletionTimestamp != nil
}
