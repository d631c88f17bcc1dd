package apiproxy

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/internal/testenv"
)

// TestOfflinePatchesCoalesce patches a Node's and a pod's status many
// times while the cloud is away, as a kubelet does: the queue keeps one
// write per object (each later patch takes the earlier one's place), and
// once the cloud is back the real kube-apiserver holds what the edge
// answered last, a condition added and deleted again on the way
// included. JSON patches are queued one by one and replayed in order.
func TestOfflinePatchesCoalesce(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const node = "edge-coalesce"
	kp, err := cp.CA.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	offline := &switchable{}
	e := startEdge(t, edgeSpec{net: hostNet{}, server: cp.URL, node: node, cert: kp.TLS, ca: cp.CA, offline: offline})
	e.waitHealthy(true, 30*time.Second)
	kubelet, _ := e.client(kubeletUA)
	if _, err := kubelet.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	createWorkload(ctx, t, cp.Client, node, "pod-merge", "pod-jsonpatch")
	if _, err := kubelet.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"pod-merge", "pod-jsonpatch"} {
		if _, err := kubelet.CoreV1().Pods(workNS).Get(ctx, p, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.EventuallyNoError(t, "the pods and the node cached", func() error {
		for _, p := range []string{"pod-merge", "pod-jsonpatch"} {
			if o, _ := e.Store.Get("kubelet", podsGVR, workNS, p); o == nil {
				return fmt.Errorf("%s not cached yet", p)
			}
		}
		if o, _ := e.Store.Get("kubelet", nodesGVR, "", node); o == nil {
			return fmt.Errorf("node not cached yet")
		}
		return nil
	})

	offline.set(true)
	const nodePatches, mergePatches = 30, 20
	for i := range nodePatches {
		patch := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":"True","message":"n%d"}]}}`, stepCondition, i)
		switch i {
		case 10:
			patch = `{"status":{"conditions":[{"type":"tether.test/Extra","status":"True"}]}}`
		case 20:
			patch = `{"status":{"conditions":[{"type":"tether.test/Extra","$patch":"delete"}]}}`
		}
		if _, err := kubelet.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatalf("offline node patch %d: %v", i, err)
		}
	}
	for i := range mergePatches {
		patch := fmt.Sprintf(`{"status":{"conditions":[{"type":%q,"status":"True","message":"m%d"}]}}`, stepCondition, i)
		if _, err := kubelet.CoreV1().Pods(workNS).Patch(ctx, "pod-merge", types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatalf("offline merge patch %d: %v", i, err)
		}
	}
	for _, patch := range []string{
		`[{"op":"add","path":"/status/conditions","value":[{"type":"tether.test/A","status":"True"}]}]`,
		`[{"op":"add","path":"/status/conditions/-","value":{"type":"tether.test/B","status":"True"}}]`,
	} {
		if _, err := kubelet.CoreV1().Pods(workNS).Patch(ctx, "pod-jsonpatch", types.JSONPatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatalf("offline JSON patch %s: %v", patch, err)
		}
	}
	if n := e.Proxy.queue.Len(); n != 4 {
		t.Fatalf("%d writes queued, want 4: one per object for the node and pod-merge, two JSON patches", n)
	}
	if c := e.metric("tether_edge_apiserver_queue_replayed_total", "result", "coalesced"); c != nodePatches-1+mergePatches-1 {
		t.Errorf("%v writes coalesced, want %d", c, nodePatches-1+mergePatches-1)
	}

	offline.set(false)
	testenv.EventuallyWithin(t, 2*time.Minute, "the queue replayed", func() bool { return e.Proxy.queue.Len() == 0 })
	n, err := cp.Client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := nodeConditions(n); got != fmt.Sprintf("%s=n%d", stepCondition, nodePatches-1) {
		t.Errorf("node conditions upstream: %s", got)
	}
	pm, err := cp.Client.CoreV1().Pods(workNS).Get(ctx, "pod-merge", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := podStep(pm); got != fmt.Sprintf("m%d", mergePatches-1) {
		t.Errorf("pod-merge upstream at step %q", got)
	}
	pj, err := cp.Client.CoreV1().Pods(workNS).Get(ctx, "pod-jsonpatch", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	have := map[corev1.PodConditionType]bool{}
	for _, c := range pj.Status.Conditions {
		have[c.Type] = true
	}
	if !have["tether.test/A"] || !have["tether.test/B"] {
		t.Errorf("pod-jsonpatch upstream conditions: %+v", pj.Status.Conditions)
	}
	if a := e.metric("tether_edge_apiserver_queue_replayed_total", "result", "applied"); a != 4 {
		t.Errorf("%v writes applied, want 4\n%s", a, e.logs.String())
	}
	for _, r := range []string{"rejected", "obsolete"} {
		if v := e.metric("tether_edge_apiserver_queue_replayed_total", "result", r); v != 0 {
			t.Errorf("%v writes %s\n%s", v, r, e.logs.String())
		}
	}
}

// nodeConditions lists a Node's conditions as type=message, in order.
func nodeConditions(n *corev1.Node) string {
	s := ""
	for i, c := range n.Status.Conditions {
		if i > 0 {
			s += ","
		}
		s += string(c.Type) + "=" + c.Message
	}
	return s
}
