package apiproxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/internal/testenv"
)

// TestReplayRebasesNodeStatus queues a kubelet's status patch of its own
// Node offline (a heartbeat of conditions that are True, made against
// the Node as cached), has kube-controller-manager's node lifecycle mark
// the conditions Unknown upstream meanwhile, and heals. Sent as queued,
// the heartbeat would leave Ready Unknown (kube-apiserver keeps no
// managedFields on Nodes, so the write does not even look obsolete);
// rebased on the upstream Node, it lands Ready=True at the replay; a
// condition kube-controller-manager added stays; the ledger counts the
// write applied and balances. A pod's status patch the controller
// overwrote is still dropped as obsolete.
func TestReplayRebasesNodeStatus(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const node = "edge-rebase"
	kp, err := cp.CA.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	offline := &switchable{}
	e := startEdge(t, edgeSpec{net: hostNet{}, server: cp.URL, node: node, cert: kp.TLS, ca: cp.CA, offline: offline})
	e.waitHealthy(true, 30*time.Second)
	kubelet, _ := e.client(kubeletUA)
	kcmCfg := rest.CopyConfig(cp.Admin)
	kcmCfg.UserAgent = "kube-controller-manager/v1.36.3 (linux/amd64) kubernetes/abc"
	kcm, err := kubernetes.NewForConfig(kcmCfg)
	if err != nil {
		t.Fatal(err)
	}

	// Online: registered and Ready, as kubelet leaves it.
	if _, err := kubelet.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ready := `{"status":{"conditions":[` +
		`{"type":"Ready","status":"True","reason":"KubeletReady","message":"kubelet is posting ready status","lastHeartbeatTime":%q,"lastTransitionTime":%q},` +
		`{"type":"MemoryPressure","status":"False","reason":"KubeletHasSufficientMemory","lastHeartbeatTime":%q,"lastTransitionTime":%q}]}}`
	t0 := metav1.Now().Rfc3339Copy().Format(time.RFC3339)
	if _, err := kubelet.CoreV1().Nodes().Patch(ctx, node, "application/strategic-merge-patch+json",
		fmt.Appendf(nil, ready, t0, t0, t0, t0), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	createWorkload(ctx, t, cp.Client, node, "pod-r")
	testenv.EventuallyNoError(t, "the node may read its pod", func() error { // the Node authorizer's graph follows
		_, err := kubelet.CoreV1().Pods(workNS).Get(ctx, "pod-r", metav1.GetOptions{})
		return err
	})
	if _, err := kubelet.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyNoError(t, "the node and the pod cached", func() error {
		n, _ := e.Store.Get("kubelet", nodesGVR, "", node)
		p, _ := e.Store.Get("kubelet", podsGVR, workNS, "pod-r")
		if n == nil || p == nil || !hasCondition(n.Raw, "Ready", "True") {
			return errors.New("not cached yet")
		}
		return nil
	})

	// Offline: kubelet's heartbeat patch, made against its lister (the
	// cached Node, Ready=True), carries the heartbeat times only.
	offline.set(true)
	hb := metav1.Now().Rfc3339Copy().Add(time.Second).Format(time.RFC3339)
	beat := fmt.Appendf(nil, `{"status":{"conditions":[{"type":"Ready","lastHeartbeatTime":%q},{"type":"MemoryPressure","lastHeartbeatTime":%q}]}}`, hb, hb)
	if _, err := kubelet.CoreV1().Nodes().Patch(ctx, node, "application/strategic-merge-patch+json", beat, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("offline heartbeat: %v", err)
	}
	if _, err := patchPodStep(ctx, kubelet, "pod-r", "k1"); err != nil {
		t.Fatal(err)
	}
	// managedFields keep whole seconds: the controller writes in a later
	// second than the queued patches.
	queued := time.Now()
	testenv.Eventually(t, "the next second", func() bool {
		return time.Now().Truncate(time.Second).After(queued.Truncate(time.Second))
	})
	// kube-controller-manager's node lifecycle: the kubelet stopped
	// posting, its conditions become Unknown; and another condition.
	n, err := kcm.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	for i := range n.Status.Conditions {
		c := &n.Status.Conditions[i]
		c.Status, c.Reason, c.Message, c.LastTransitionTime = corev1.ConditionUnknown, "NodeStatusUnknown", "Kubelet stopped posting node status.", now
	}
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse,
		Reason: "RouteCreated", LastTransitionTime: now, LastHeartbeatTime: now})
	if _, err := kcm.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := patchPodStep(ctx, kcm, "pod-r", "by-controller"); err != nil {
		t.Fatal(err)
	}

	offline.set(false)
	testenv.EventuallyNoError(t, "the queue replayed", func() error {
		if n := e.Proxy.queue.Len(); n != 0 {
			return fmt.Errorf("%d queued", n)
		}
		return nil
	})
	up, err := cp.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[corev1.NodeConditionType]corev1.ConditionStatus{corev1.NodeReady: corev1.ConditionTrue,
		corev1.NodeMemoryPressure: corev1.ConditionFalse, corev1.NodeNetworkUnavailable: corev1.ConditionFalse}
	for _, c := range up.Status.Conditions {
		if s, ok := want[c.Type]; ok && c.Status == s {
			delete(want, c.Type)
		}
		if c.Type == corev1.NodeReady && (c.Reason != "KubeletReady" || !c.LastTransitionTime.After(now.Time.Add(-time.Second)) ||
			c.LastHeartbeatTime.Format(time.RFC3339) != hb) {
			t.Errorf("Ready upstream: %+v; want kubelet's, with its heartbeat %s and a transition at the replay", c, hb)
		}
	}
	if len(want) != 0 {
		t.Errorf("upstream conditions %+v; missing %v", up.Status.Conditions, want)
	}
	pod, err := cp.Client.CoreV1().Pods(workNS).Get(ctx, "pod-r", metav1.GetOptions{})
	if err != nil || podStep(pod) != "by-controller" {
		t.Errorf("pod-r upstream: step %q, %v; want the controller's (the pod's write dropped)", podStep(pod), err)
	}
	for result, n := range map[string]float64{"rebased": 1, "obsolete": 1, "applied": 0} {
		if got := e.metric("tether_edge_apiserver_queue_replayed_total", "result", result); got != n {
			t.Errorf("replayed %s: %v, want %v", result, got, n)
		}
	}
	l, err := e.Store.Ledger()
	if err != nil {
		t.Fatal(err)
	}
	if want := (cache.Ledger{Enqueued: 2, Applied: 1, Obsolete: 1}); l != want {
		t.Errorf("ledger: %v\nwant %v", l, want)
	}
}

// hasCondition reports whether a Node's JSON has the condition with the
// status.
func hasCondition(raw []byte, typ, status string) bool {
	var n corev1.Node
	if err := json.Unmarshal(raw, &n); err != nil {
		return false
	}
	for _, c := range n.Status.Conditions {
		if string(c.Type) == typ && string(c.Status) == status {
			return true
		}
	}
	return false
}
