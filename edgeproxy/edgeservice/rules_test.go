package edgeservice

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/edgeaccess"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/netrules"
)

// fakeRules records what it was asked to hold.
type fakeRules struct {
	mu      sync.Mutex
	applied []netrules.EdgeDesired
	cleaned int
}

func (f *fakeRules) Apply(_ context.Context, d netrules.EdgeDesired) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied = append(f.applied, d)
	return nil
}

func (f *fakeRules) Cleanup(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.cleaned++
	return nil
}

func (*fakeRules) Backend() string { return "fake" }

func (f *fakeRules) last() (netrules.EdgeDesired, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.applied) == 0 {
		return netrules.EdgeDesired{}, 0
	}
	return f.applied[len(f.applied)-1], f.cleaned
}

type fakeNode struct {
	fakeRanges
	addrs []netip.Addr
}

func (f fakeNode) InternalIPs() ([]netip.Addr, bool) { return f.addrs, true }

// The rules follow the index: applied at the start, again when the
// marked Services change, and removed at the end.
func TestReconciler(t *testing.T) {
	rules := &fakeRules{}
	ix := &Index{}
	changed := make(chan struct{}, 1)
	node := fakeNode{fakeRanges{netip.MustParsePrefix("10.244.1.0/24")}, []netip.Addr{netip.MustParseAddr("192.168.50.10")}}
	r := &Reconciler{Rules: rules, Node: node, Index: ix, ListenPort: 10271, Changed: changed, LocalAddrs: fakeAddrs{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	testenv.Eventually(t, "first apply", func() bool {
		d, _ := rules.last()
		return d.ListenPort == 10271 && len(d.Services) == 0 && slices.Equal(d.PodNets, node.fakeRanges) &&
			slices.Equal(d.NodeAddrs, node.addrs)
	})
	ix.Set([]*corev1.Service{{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "orders",
		Annotations: map[string]string{edgeaccess.Annotation: "true"}},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: []corev1.ServicePort{{Port: 80}}}}})
	changed <- struct{}{}
	testenv.Eventually(t, "the marked Service applied", func() bool {
		d, _ := rules.last()
		return slices.Equal(d.Services, []netip.AddrPort{marked})
	})
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if _, cleaned := rules.last(); cleaned != 1 {
		t.Errorf("Cleanup called %d times, want 1", cleaned)
	}
}
