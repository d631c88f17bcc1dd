package nodewatch

import (
	"context"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestWatcherFake checks the publishing logic against client-go's fake
// clientset: initial sync, changes, no-op updates, deletes, late
// subscribers.
func TestWatcherFake(t *testing.T) {
	client := fake.NewClientset(
		node("edge-1", map[string]string{EdgeLabel: "true", PoolLabel: "shop"}, nil, addr(corev1.NodeInternalIP, "10.0.0.1")),
		node("cloud-1", nil, nil, addr(corev1.NodeInternalIP, "172.16.0.1")),
	)
	watching := make(chan struct{})
	var once sync.Once
	client.PrependWatchReactor("nodes", func(k8stesting.Action) (bool, watch.Interface, error) {
		once.Do(func() { close(watching) }) // changes made before the watch would be lost
		return false, nil, nil
	})
	w := New(client, Options{})
	got := make(chan *Snapshot, 100)
	w.Subscribe(func(s *Snapshot) { got <- s })

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	if err := w.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	<-watching

	s := next(t, got)
	if n, ok := s.Lookup("edge-1"); !ok || !n.Edge || n.Pool != "shop" || len(n.InternalIPs) != 1 {
		t.Fatalf("edge-1 after sync: %+v %v", n, ok)
	}
	if n, ok := s.Lookup("cloud-1"); !ok || n.Edge {
		t.Fatalf("cloud-1 after sync: %+v %v", n, ok)
	}
	if w.Snapshot() != s {
		t.Error("Snapshot() is not the published snapshot")
	}

	nodes := client.CoreV1().Nodes()
	// A change that nodewatch does not read publishes nothing...
	n1, _ := nodes.Get(ctx, "edge-1", metav1.GetOptions{})
	n1.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	if _, err := nodes.UpdateStatus(ctx, n1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// ...so the next snapshot is the one with the VIP, one version later.
	n1, _ = nodes.Get(ctx, "edge-1", metav1.GetOptions{})
	n1.Annotations = map[string]string{VIPAnnotation: "100.64.0.1"}
	if _, err := nodes.Update(ctx, n1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s2 := next(t, got)
	if s2.Version != s.Version+1 || s2.Nodes["edge-1"].VIP != ip("100.64.0.1") {
		t.Fatalf("after VIP annotation: version %d (was %d), edge-1 %+v", s2.Version, s.Version, s2.Nodes["edge-1"])
	}
	if s.Nodes["edge-1"].VIP.IsValid() {
		t.Error("the earlier snapshot changed")
	}

	if _, err := nodes.Create(ctx, node("edge-2", map[string]string{EdgeLabel: "true"}, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, got, func(s *Snapshot) bool { _, ok := s.Lookup("edge-2"); return ok })

	if err := nodes.Delete(ctx, "edge-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	last := waitFor(t, got, func(s *Snapshot) bool { _, ok := s.Lookup("edge-1"); return !ok })

	// A late subscriber gets the current snapshot at once.
	late := make(chan *Snapshot, 1)
	w.Subscribe(func(s *Snapshot) { late <- s })
	if s := next(t, late); s != last {
		t.Errorf("late subscriber got version %d, want %d", s.Version, last.Version)
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if err := w.Run(t.Context()); err == nil {
		t.Error("second Run did not fail")
	}
}

// TestTrim checks that the informer cache keeps only what conversion reads.
func TestTrim(t *testing.T) {
	n := node("edge-1", map[string]string{EdgeLabel: "true"}, map[string]string{VIPAnnotation: "100.64.0.1"},
		addr(corev1.NodeInternalIP, "10.0.0.1"))
	n.Status.Images = []corev1.ContainerImage{{Names: []string{"big"}, SizeBytes: 1 << 30}}
	n.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	out, err := trim(n)
	if err != nil {
		t.Fatal(err)
	}
	tn := out.(*corev1.Node)
	if len(tn.Status.Images) != 0 || len(tn.ManagedFields) != 0 {
		t.Error("trim kept images or managed fields")
	}
	a, _ := fromObject(n, DefaultEdgeSelector())
	b, _ := fromObject(tn, DefaultEdgeSelector())
	if !a.Equal(b) {
		t.Errorf("trimmed node converts to %+v, untrimmed to %+v", b, a)
	}
	var _ runtime.Object = tn
}

func next(t *testing.T, ch <-chan *Snapshot) *Snapshot {
	t.Helper()
	select {
	case s := <-ch:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("no snapshot published within 10 s")
		return nil
	}
}

// waitFor returns the first published snapshot for which ok holds,
// checking that versions only grow.
func waitFor(t *testing.T, ch <-chan *Snapshot, ok func(*Snapshot) bool) *Snapshot {
	t.Helper()
	var prev uint64
	for {
		s := next(t, ch)
		if s.Version <= prev {
			t.Fatalf("snapshot version %d after %d", s.Version, prev)
		}
		prev = s.Version
		if ok(s) {
			return s
		}
	}
}
