package nodewatch_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/testenv"
)

// TestWatcherAPIServer runs two watchers against a real kube-apiserver:
// the default edge selector and a custom one; checks pool, addresses from
// status (written with UpdateStatus, as the kubelet does) and the VIP
// annotation, then a label change and a delete.
func TestWatcherAPIServer(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx := t.Context()
	c := cp.Client

	createNode(t, c, "edge-a", map[string]string{nodewatch.EdgeLabel: "true", nodewatch.PoolLabel: "shop-1"},
		map[string]string{nodewatch.VIPAnnotation: "100.64.0.10"}, "10.1.0.1", "fd01::1")
	createNode(t, c, "cloud-b", nil, nil, "172.16.0.2")
	createNode(t, c, "site-c", map[string]string{"example.com/site": "north"}, nil, "10.3.0.1")

	custom, err := labels.Parse("example.com/site=north")
	if err != nil {
		t.Fatal(err)
	}
	def := start(t, nodewatch.New(c, nodewatch.Options{}))
	cus := start(t, nodewatch.New(c, nodewatch.Options{EdgeSelector: custom}))

	s := def.Snapshot()
	if len(s.Nodes) != 3 {
		t.Fatalf("synced snapshot has %d nodes, want 3: %v", len(s.Nodes), s.Nodes)
	}
	a, _ := s.Lookup("edge-a")
	want := nodewatch.Node{Name: "edge-a", Edge: true, Pool: "shop-1",
		InternalIPs: []netip.Addr{netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("fd01::1")},
		VIP:         netip.MustParseAddr("100.64.0.10")}
	if !a.Equal(want) {
		t.Errorf("edge-a = %+v, want %+v", a, want)
	}
	if b, _ := s.Lookup("cloud-b"); b.Edge || len(b.InternalIPs) != 1 {
		t.Errorf("cloud-b = %+v, want a cloud node with one address", b)
	}
	if sc, _ := s.Lookup("site-c"); sc.Edge {
		t.Error("site-c is edge under the default selector")
	}
	cs := cus.Snapshot()
	if n, _ := cs.Lookup("site-c"); !n.Edge {
		t.Error("site-c is not edge under the custom selector")
	}
	if n, _ := cs.Lookup("edge-a"); n.Edge {
		t.Error("edge-a is edge under the custom selector")
	}

	// Label removed: edge-a becomes a cloud node.
	n, err := c.CoreV1().Nodes().Get(ctx, "edge-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(n.Labels, nodewatch.EdgeLabel)
	if _, err := c.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, def, func(s *nodewatch.Snapshot) bool { n, ok := s.Lookup("edge-a"); return ok && !n.Edge })

	if err := c.CoreV1().Nodes().Delete(ctx, "cloud-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, def, func(s *nodewatch.Snapshot) bool { _, ok := s.Lookup("cloud-b"); return !ok })
}

// createNode creates a Node and sets its InternalIP addresses in status.
func createNode(t *testing.T, c kubernetes.Interface, name string, labels, annotations map[string]string, ips ...string) *corev1.Node {
	t.Helper()
	n, err := c.CoreV1().Nodes().Create(t.Context(), &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node %s: %v", name, err)
	}
	for _, ip := range ips {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	n, err = c.CoreV1().Nodes().UpdateStatus(t.Context(), n, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("set addresses of node %s: %v", name, err)
	}
	return n
}

// start runs w until the test ends and waits for its first snapshot.
func start(t *testing.T, w *nodewatch.Watcher) *nodewatch.Watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	wctx, wcancel := context.WithTimeout(ctx, 30*time.Second)
	defer wcancel()
	if err := w.WaitSynced(wctx); err != nil {
		t.Fatalf("WaitSynced: %v", err)
	}
	return w
}

func eventually(t *testing.T, w *nodewatch.Watcher, ok func(*nodewatch.Snapshot) bool) {
	t.Helper()
	testenv.Eventually(t, "the snapshot to change", func() bool { return ok(w.Snapshot()) })
}
