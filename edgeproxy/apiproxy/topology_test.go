package apiproxy

//lint:file-ignore SA1019 core/v1 Endpoints is deprecated but still served and read (kube-proxy, coredns and ingress controllers of older clusters); the topology filter must cover it.

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/edgeproxy/filter"
	"github.com/tether-edge/tether/internal/testenv"
)

const (
	kubeProxyUA = "kube-proxy/v1.36.3 (linux/amd64) kubernetes/abc"
	corednsUA   = "coredns/1.12.0"
	topoNS      = "topo"
)

// TestTopologyAgainstKubeAPIServer runs the proxy with the topology filter
// against a real kube-apiserver (no controller-manager: the test writes
// the EndpointSlices and Endpoints itself).
func TestTopologyAgainstKubeAPIServer(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := testenv.ApplyManifests(ctx, cp.Admin, false, "../../packaging/kubernetes/edge-rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	admin := cp.Client
	setupTopology(t, ctx, admin)

	kp, err := cp.CA.NodeCert("me")
	if err != nil {
		t.Fatal(err)
	}
	e := startEdge(t, edgeSpec{net: hostNet{}, server: cp.URL, node: "me", cert: kp.TLS, ca: cp.CA, topology: true})
	e.waitHealthy(true, 30*time.Second)
	kubeProxy, _ := e.client(kubeProxyUA)
	_, jcfg := e.client(corednsUA)
	jcfg.ContentType, jcfg.AcceptContentTypes = "application/json", "application/json"
	coredns := kubernetes.NewForConfigOrDie(jcfg)
	kubelet, _ := e.client(kubeletUA)

	t.Run("List", func(t *testing.T) {
		want := map[string][]string{"host": {"me"}, "pool": {"a", "me"}, "plain": {"", "a", "b", "me"}, "fallback": {"a", "me"}}
		for name, c := range map[string]kubernetes.Interface{"kube-proxy (protobuf)": kubeProxy, "coredns (JSON)": coredns} {
			l, err := c.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if d := cmp.Diff(want, sliceNodes(l.Items)); d != "" {
				t.Errorf("%s: endpoints by service (-want +got):\n%s", name, d)
			}
			ep, err := c.CoreV1().Endpoints(topoNS).Get(ctx, "pool", metav1.GetOptions{})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if d := cmp.Diff([]string{"me", "a"}, endpointsNodes(ep)); d != "" {
				t.Errorf("%s: Endpoints pool (-want +got):\n%s", name, d)
			}
		}
		// Components outside the list get everything.
		l, err := kubelet.DiscoveryV1().EndpointSlices(topoNS).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := sliceNodes(l.Items)["host"]; len(got) != 4 {
			t.Errorf("kubelet sees host's endpoints %v, want all 4", got)
		}
	})

	t.Run("WatchFollowsChanges", func(t *testing.T) {
		for name, c := range map[string]kubernetes.Interface{"kube-proxy (protobuf)": kubeProxy, "coredns (JSON)": coredns} {
			t.Run(name, func(t *testing.T) { testTopologyWatch(t, ctx, admin, c) })
		}
	})

	t.Run("NotSyncedAnswers503", func(t *testing.T) {
		kp2, _ := cp.CA.NodeCert("other")
		e2 := startEdge(t, edgeSpec{net: hostNet{}, server: cp.URL, node: "other", cert: kp2.TLS, ca: cp.CA, topology: true})
		never := &neverSynced{Topology: e2.Proxy.topo} // informers that never sync
		e2.Proxy.topo = never
		e2.waitHealthy(true, 30*time.Second)
		// Answered, not held: the request gets a generous deadline, and the
		// proxy must have bounded its wait for the informers.
		rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
		defer rcancel()
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, "http://"+e2.Addr+"/apis/discovery.k8s.io/v1/endpointslices", nil)
		req.Header.Set("User-Agent", kubeProxyUA)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		// client-go retries a 503 with Retry-After on its own.
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("list before sync: %s, Retry-After %q; want 503 with Retry-After", resp.Status, resp.Header.Get("Retry-After"))
		}
		if d := time.Duration(never.asked.Load()); d <= 0 || d > topologySyncWait {
			t.Fatalf("the proxy waited up to %v for the informers, want a wait of at most %v", d, topologySyncWait)
		}
	})

	t.Run("ProxyLeavesNothing", func(t *testing.T) { testProxyLeavesNothing(t, ctx, cp, admin) })
}

// neverSynced is a filter whose informers never sync; it records the
// longest wait it was asked for.
type neverSynced struct {
	Topology
	asked atomic.Int64
}

func (n *neverSynced) WaitSynced(_ context.Context, d time.Duration) bool {
	for {
		old := n.asked.Load()
		if int64(d) <= old || n.asked.CompareAndSwap(old, int64(d)) {
			return false
		}
	}
}

func testTopologyWatch(t *testing.T, ctx context.Context, admin, c kubernetes.Interface) {
	// Reset: "plain" has no annotation, b is in p2. The proxy's informers
	// have seen both once a list through it filters accordingly.
	patchService(t, ctx, admin, "plain", "")
	patchNodePool(t, ctx, admin, "b", "p2")
	var l *discoveryv1.EndpointSliceList
	testenv.EventuallyNoError(t, "the filtered EndpointSlices", func() error {
		var err error
		if l, err = c.DiscoveryV1().EndpointSlices(topoNS).List(ctx, metav1.ListOptions{}); err != nil {
			return err
		}
		got := sliceNodes(l.Items)
		if !slices.Equal(got["plain"], []string{"", "a", "b", "me"}) || !slices.Equal(got["pool"], []string{"a", "me"}) {
			return fmt.Errorf("the proxy filters with the state before the reset: %v", got)
		}
		return nil
	})
	listed := map[string]string{} // Service → its slice's resourceVersion
	for _, s := range l.Items {
		listed[s.Labels[discoveryv1.LabelServiceName]] = s.ResourceVersion
	}
	w, err := c.DiscoveryV1().EndpointSlices(topoNS).Watch(ctx, metav1.ListOptions{ResourceVersion: l.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	// An annotation change reaches the open watch: the slice, unchanged in
	// the cloud (same resourceVersion), sent again filtered anew. Nothing
	// else would send it: the slice itself does not change.
	start := time.Now()
	patchService(t, ctx, admin, "plain", filter.KeyHostname)
	waitSlice(t, w, "plain", []string{"me"}, listed["plain"])
	t.Logf("annotation change → MODIFIED on the watch: %v", time.Since(start))

	// A node moved into this node's pool: "pool" now has b too.
	start = time.Now()
	patchNodePool(t, ctx, admin, "b", "p1")
	waitSlice(t, w, "pool", []string{"a", "b", "me"}, listed["pool"])
	t.Logf("pool change → MODIFIED on the watch: %v", time.Since(start))
	patchNodePool(t, ctx, admin, "b", "p2")
	waitSlice(t, w, "pool", []string{"a", "me"}, listed["pool"])
}

// waitSlice waits for a MODIFIED of svc's slice at resourceVersion rv
// with endpoints on the nodes want.
func waitSlice(t *testing.T, w watch.Interface, svc string, want []string, rv string) {
	t.Helper()
	const within = 30 * time.Second
	timeout := time.After(within)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch ended waiting for %s = %v", svc, want)
			}
			if ev.Type == watch.Error {
				t.Logf("watch error event: %v", ev.Object)
			}
			s, isSlice := ev.Object.(*discoveryv1.EndpointSlice)
			if !isSlice || s.Labels[discoveryv1.LabelServiceName] != svc {
				continue
			}
			got := sliceNodes([]discoveryv1.EndpointSlice{*s})[svc]
			if ev.Type == watch.Modified && slices.Equal(got, want) {
				if s.ResourceVersion != rv {
					t.Fatalf("%s's slice sent at resourceVersion %s, want %s: not a re-send of the unchanged slice", svc, s.ResourceVersion, rv)
				}
				return
			}
		case <-timeout:
			t.Fatalf("no MODIFIED of %s with endpoints on %v within %v", svc, want, within)
		}
	}
}

// setupTopology creates nodes me, a (pool p1), b (p2), and Services host
// (hostname), pool (nodepool), fallback (hostname,nodepool,*) and plain
// (none) in namespace topo, each with one EndpointSlice with endpoints on
// me (not ready for fallback), a, b and one without nodeName, and the
// Endpoints of pool.
func setupTopology(t *testing.T, ctx context.Context, admin kubernetes.Interface) {
	t.Helper()
	for node, pool := range map[string]string{"me": "p1", "a": "p1", "b": "p2"} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node,
			Labels: map[string]string{filter.LabelNodePool: pool}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: topoNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for svc, keys := range map[string]string{"host": filter.KeyHostname, "pool": filter.KeyNodePool,
		"fallback": "kubernetes.io/hostname,openyurt.io/nodepool,*", "plain": ""} {
		s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: svc, Namespace: topoNS},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
		if keys != "" {
			s.Annotations = map[string]string{filter.AnnotationTopologyKeys: keys}
		}
		if _, err := admin.CoreV1().Services(topoNS).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: svc + "-x", Namespace: topoNS,
			Labels: map[string]string{discoveryv1.LabelServiceName: svc}}, AddressType: discoveryv1.AddressTypeIPv4,
			Ports: []discoveryv1.EndpointPort{{Port: ptr.To[int32](80)}}}
		for i, n := range []string{"me", "a", "b", ""} {
			ep := discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.1.0.%d", i+1)}}
			if n != "" {
				ep.NodeName = ptr.To(n)
			}
			if n == "me" && svc == "fallback" {
				ep.Conditions.Ready = ptr.To(false)
			}
			es.Endpoints = append(es.Endpoints, ep)
		}
		if _, err := admin.DiscoveryV1().EndpointSlices(topoNS).Create(ctx, es, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var addrs []corev1.EndpointAddress
	for i, n := range []string{"me", "a", "b"} {
		addrs = append(addrs, corev1.EndpointAddress{IP: fmt.Sprintf("10.1.0.%d", i+1), NodeName: ptr.To(n)})
	}
	if _, err := admin.CoreV1().Endpoints(topoNS).Create(ctx, &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "pool", Namespace: topoNS},
		Subsets: []corev1.EndpointSubset{{Addresses: addrs, Ports: []corev1.EndpointPort{{Port: 80}}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func patchService(t *testing.T, ctx context.Context, admin kubernetes.Interface, svc, keys string) {
	t.Helper()
	v := "null"
	if keys != "" {
		v = fmt.Sprintf("%q", keys)
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, filter.AnnotationTopologyKeys, v)
	if _, err := admin.CoreV1().Services(topoNS).Patch(ctx, svc, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func patchNodePool(t *testing.T, ctx context.Context, admin kubernetes.Interface, node, pool string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, filter.LabelNodePool, pool)
	if _, err := admin.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// sliceNodes is the sorted node names of each Service's endpoints.
func sliceNodes(items []discoveryv1.EndpointSlice) map[string][]string {
	out := map[string][]string{}
	for _, s := range items {
		svc := s.Labels[discoveryv1.LabelServiceName]
		out[svc] = []string{}
		for _, e := range s.Endpoints {
			out[svc] = append(out[svc], ptr.Deref(e.NodeName, ""))
		}
		sort.Strings(out[svc])
	}
	return out
}

func endpointsNodes(e *corev1.Endpoints) []string {
	var out []string
	for _, ss := range e.Subsets {
		for _, a := range append(ss.Addresses, ss.NotReadyAddresses...) {
			out = append(out, ptr.Deref(a.NodeName, ""))
		}
	}
	return out
}
