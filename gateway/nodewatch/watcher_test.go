package nodewatch

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/tether-edge/tether/gateway/internal/metrictest"
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
	n.Spec.PodCIDR, n.Spec.PodCIDRs = "10.244.1.0/24", []string{"10.244.1.0/24", "fd10::/64"}
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
	if !a.Equal(b) || len(b.PodCIDRs) != 2 {
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

// TestWatcherAddressClaims runs the routing decision through the watcher:
// a node that claims another edge's registered address does not get it,
// whatever its name; the refusal is counted once, however many snapshots carry it;
// an address that appears on the gateway host is withdrawn from the edge
// that claimed it at the next host check, without a Node event.
func TestWatcherAddressClaims(t *testing.T) {
	client := fake.NewClientset(
		node("edge-b", map[string]string{EdgeLabel: "true"}, map[string]string{RegisteredAnnotation: "10.1.0.11"}, addr(corev1.NodeInternalIP, "10.1.0.11")),
		node("edge-a", map[string]string{EdgeLabel: "true"}, nil, addr(corev1.NodeInternalIP, "10.1.0.12")),
	)
	var mu sync.Mutex
	host := ips("192.0.2.1")
	w := New(client, Options{
		HostCheckEvery: 10 * time.Millisecond,
		GatewayHost: func() ([]netip.Addr, error) {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(host), nil
		},
	})
	got := make(chan *Snapshot, 100)
	w.Subscribe(func(s *Snapshot) { got <- s })
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	s := next(t, got)
	if n, _ := s.Routing(ModeNodeIP).Owner(ip("10.1.0.11")); n != "edge-b" {
		t.Fatalf("owner of 10.1.0.11 after sync: %q", n)
	}

	// edge-a sorts first and now claims edge-b's address too.
	nodes := client.CoreV1().Nodes()
	a, _ := nodes.Get(ctx, "edge-a", metav1.GetOptions{})
	a.Status.Addresses = []corev1.NodeAddress{addr(corev1.NodeInternalIP, "10.1.0.11")}
	if _, err := nodes.UpdateStatus(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s = waitFor(t, got, func(s *Snapshot) bool {
		return len(s.Nodes["edge-a"].InternalIPs) == 1 && s.Nodes["edge-a"].InternalIPs[0] == ip("10.1.0.11")
	})
	if n, _ := s.Routing(ModeNodeIP).Owner(ip("10.1.0.11")); n != "edge-b" {
		t.Errorf("owner of 10.1.0.11 after edge-a claimed it: %q, want edge-b", n)
	}
	want := []Refusal{{Addr: ip("10.1.0.11"), Node: "edge-a", Reason: ReasonConflict, Holder: "edge-b"}}
	if diff := cmp.Diff(want, s.Routing(ModeNodeIP).Refused(), addrCmp); diff != "" {
		t.Errorf("refusals (-want +got):\n%s", diff)
	}

	// Another change republishes; the conflict is still counted once.
	b, _ := nodes.Get(ctx, "edge-b", metav1.GetOptions{})
	b.Labels[PoolLabel] = "shop"
	if _, err := nodes.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, got, func(s *Snapshot) bool { return s.Nodes["edge-b"].Pool == "shop" })
	if n := metric(t, w, "tether_gateway_address_refusals_total", "reason=conflict"); n != 1 {
		t.Errorf("conflicts counted %v times, want once", n)
	}
	if n := metric(t, w, "tether_gateway_address_refusals", "reason=conflict"); n != 1 {
		t.Errorf("conflicts now: %v, want 1", n)
	}

	// The host gains edge-b's address: the next host check withdraws it.
	mu.Lock()
	host = append(host, ip("10.1.0.11"))
	mu.Unlock()
	s = waitFor(t, got, func(s *Snapshot) bool { _, ok := s.Routing(ModeNodeIP).Owner(ip("10.1.0.11")); return !ok })
	if n := metric(t, w, "tether_gateway_address_refusals", "reason=gateway_host"); n != 2 {
		t.Errorf("gateway_host refusals now: %v, want both claims (%+v)", n, s.Routing(ModeNodeIP).Refused())
	}
}

// TestWatcherPodRanges: a published snapshot carries the pod ranges the
// policy routes; a range the control plane gives a second edge is taken
// from both, counted once, and given back when the second edge loses it.
func TestWatcherPodRanges(t *testing.T) {
	withPods := func(n *corev1.Node, cidrs ...string) *corev1.Node {
		n.Spec.PodCIDRs = cidrs
		return n
	}
	client := fake.NewClientset(
		withPods(node("edge-a", map[string]string{EdgeLabel: "true"}, nil, addr(corev1.NodeInternalIP, "192.168.1.10")), "10.244.1.0/24"),
		withPods(node("edge-b", map[string]string{EdgeLabel: "true"}, nil, addr(corev1.NodeInternalIP, "192.168.1.10")), "10.244.2.0/24"),
	)
	w := New(client, Options{PodPolicy: PodPolicy{Ranges: pfx("10.244.0.0/16")}})
	got := make(chan *Snapshot, 100)
	w.Subscribe(func(s *Snapshot) { got <- s })
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	s := next(t, got)
	if n, _, _ := s.Pods.Owner(ip("10.244.2.9")); n != "edge-b" {
		t.Fatalf("owner of 10.244.2.9 after sync: %q, want edge-b", n)
	}
	nodes := client.CoreV1().Nodes()
	b, _ := nodes.Get(ctx, "edge-b", metav1.GetOptions{})
	b.Spec.PodCIDRs = []string{"10.244.1.0/24"}
	if _, err := nodes.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s = waitFor(t, got, func(s *Snapshot) bool { return len(s.Pods.Refused()) == 2 })
	if n, _, ok := s.Pods.Owner(ip("10.244.1.9")); ok {
		t.Errorf("a contested range still reaches %s", n)
	}
	if n := metric(t, w, "tether_gateway_pod_range_refusals", "reason=conflict"); n != 2 {
		t.Errorf("pod range conflicts now: %v, want 2", n)
	}
	b.Spec.PodCIDRs = []string{"10.244.3.0/24"}
	if _, err := nodes.Update(ctx, b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s = waitFor(t, got, func(s *Snapshot) bool { return len(s.Pods.Refused()) == 0 })
	if n, _, _ := s.Pods.Owner(ip("10.244.1.9")); n != "edge-a" {
		t.Errorf("owner of 10.244.1.9 after the contest ended: %q, want edge-a", n)
	}
	if n := metric(t, w, "tether_gateway_pod_range_refusals_total", "reason=conflict"); n != 2 {
		t.Errorf("pod range conflicts counted %v times, want 2 (one per claimant)", n)
	}
}

func metric(t *testing.T, w *Watcher, name string, labels ...string) float64 {
	t.Helper()
	v, err := metrictest.Value(w, name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
