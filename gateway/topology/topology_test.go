package topology

//lint:file-ignore SA1019 core/v1 Endpoints is deprecated but still served and read (kube-proxy, coredns and ingress controllers of older clusters); the topology filter must cover it.

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/testenv"
)

const ns = "topo"

// TestAgainstKubeAPIServer runs the controller as the user tether-gateway
// with gateway-rbac.yaml against a real kube-apiserver, and checks that
// it stamps exactly the affected objects.
func TestAgainstKubeAPIServer(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := testenv.ApplyManifests(ctx, cp.Admin, false, "../../packaging/kubernetes/gateway-rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	admin := cp.Client
	// Pools: p1 {a, b}, p2 {c}, p3 {d}; e has no pool; m, alone in pm-1,
	// carries the marker (below).
	for node, pool := range map[string]string{"a": "p1", "b": "p1", "c": "p2", "d": "p3", "e": "", "m": "pm-1"} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
		if pool != "" {
			n.Labels = map[string]string{openyurt.PoolLabel: pool}
		}
		must(t, create(admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})))
	}
	must(t, create(admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})))
	// Services: keys and the nodes of their endpoints.
	services := []struct {
		name, keys string
		nodes      []string
	}{
		{"host-a", openyurt.KeyHostname, []string{"a"}},
		{"pool-a", openyurt.KeyNodePool, []string{"a"}},
		{"zone-c", openyurt.KeyZone, []string{"c"}},
		{"pool-d", openyurt.KeyNodePool, []string{"d"}},
		{"fb-b", "kubernetes.io/hostname,openyurt.io/nodepool,*", []string{"b"}},
		{"plain-a", "", []string{"a"}},
		{"marker", openyurt.KeyNodePool, []string{"m"}},
	}
	for _, s := range services {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns}, Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}
		if s.keys != "" {
			svc.Annotations = map[string]string{openyurt.TopologyKeysAnnotation: s.keys}
		}
		must(t, create(admin.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})))
		es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: s.name + "-x", Namespace: ns,
			Labels: map[string]string{discoveryv1.LabelServiceName: s.name}}, AddressType: discoveryv1.AddressTypeIPv4}
		var addrs []corev1.EndpointAddress
		for i, n := range s.nodes {
			es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{fmt.Sprintf("10.2.0.%d", i+1)}, NodeName: ptr.To(n)})
			addrs = append(addrs, corev1.EndpointAddress{IP: fmt.Sprintf("10.2.0.%d", i+1), NodeName: ptr.To(n)})
		}
		must(t, create(admin.DiscoveryV1().EndpointSlices(ns).Create(ctx, es, metav1.CreateOptions{})))
		must(t, create(admin.CoreV1().Endpoints(ns).Create(ctx, &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: ns},
			Subsets: []corev1.EndpointSubset{{Addresses: addrs, Ports: []corev1.EndpointPort{{Port: 80}}}}}, metav1.CreateOptions{})))
	}

	kp, err := cp.CA.ClientCert("tether-gateway")
	if err != nil {
		t.Fatal(err)
	}
	gw, err := kubernetes.NewForConfig(cp.RESTConfig(kp))
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	if os.Getenv("TETHER_TEST_LOGS") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	c := New(gw, Options{Logger: log})
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testenv.Eventually(t, "the informers synced", func() bool {
		return c.synced[0]() && c.synced[1]() && c.synced[2]() && c.synced[3]()
	})

	// After each change, a change of the same kind that stamps only the
	// marker Service: its informer delivers both in order, and one worker
	// takes what they queue in order, so once the marker is stamped,
	// whatever the change stamps has been. Its key stays pool-typed.
	markerKeys := []string{openyurt.KeyNodePool + ",*", openyurt.KeyNodePool}
	markerPools := []string{"pm-2", "pm-1"}
	markers := 0
	markService := func() {
		patch(t, ctx, admin, "services", "marker", openyurt.TopologyKeysAnnotation, markerKeys[markers%2])
		markers++
	}
	markNode := func() {
		patch(t, ctx, admin, "nodes", "m", openyurt.PoolLabel, markerPools[markers%2])
		markers++
	}
	step := func(name string, change, mark func(), want ...string) {
		t.Helper()
		before := triggers(t, ctx, admin)
		change()
		mark()
		var got []string
		testenv.Eventually(t, name+": the marker stamped", func() bool {
			got = changed(before, triggers(t, ctx, admin))
			return slices.Contains(got, "endpoints/marker") && slices.Contains(got, "endpointslice/marker-x")
		})
		got = slices.DeleteFunc(got, func(o string) bool { return o == "endpoints/marker" || o == "endpointslice/marker-x" })
		var wantObjs []string
		for _, w := range want {
			wantObjs = append(wantObjs, "endpoints/"+w, "endpointslice/"+w+"-x")
		}
		sort.Strings(wantObjs)
		if fmt.Sprint(got) != fmt.Sprint(wantObjs) {
			t.Errorf("%s: stamped %v, want %v", name, got, wantObjs)
		}
	}
	step("annotation of plain-a added", func() {
		patch(t, ctx, admin, "services", "plain-a", openyurt.TopologyKeysAnnotation, openyurt.KeyHostname)
	},
		markService, "plain-a")
	step("annotation of host-a changed", func() {
		patch(t, ctx, admin, "services", "host-a", openyurt.TopologyKeysAnnotation, openyurt.KeyNodePool)
	},
		markService, "host-a")
	// b moves from p1 to p2: pool-typed Services with endpoints on p1 or
	// p2 members (a, b, c): pool-a, zone-c, fb-b, host-a (now nodepool);
	// not pool-d (p3), not plain-a (hostname).
	step("b moved from p1 to p2", func() { patch(t, ctx, admin, "nodes", "b", openyurt.PoolLabel, "p2") },
		markNode, "fb-b", "host-a", "pool-a", "zone-c")
	step("e joins p3", func() { patch(t, ctx, admin, "nodes", "e", openyurt.PoolLabel, "p3") }, markNode, "pool-d")
	step("a label unrelated to pools", func() { patch(t, ctx, admin, "nodes", "c", "example.com/x", "y") }, markNode)
}

// triggers is the update-trigger of every EndpointSlice and Endpoints.
func triggers(t *testing.T, ctx context.Context, admin kubernetes.Interface) map[string]string {
	out := map[string]string{}
	sl, err := admin.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
	must(t, err)
	for _, s := range sl.Items {
		out["endpointslice/"+s.Name] = s.ResourceVersion
	}
	ep, err := admin.CoreV1().Endpoints(ns).List(ctx, metav1.ListOptions{})
	must(t, err)
	for _, e := range ep.Items {
		out["endpoints/"+e.Name] = e.ResourceVersion
	}
	return out
}

func changed(before, after map[string]string) []string {
	var out []string
	for k, v := range after {
		if before[k] != v {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func patch(t *testing.T, ctx context.Context, admin kubernetes.Interface, resource, name, key, value string) {
	t.Helper()
	field := "annotations"
	if resource == "nodes" {
		field = "labels"
	}
	p := fmt.Appendf(nil, `{"metadata":{%q:{%q:%q}}}`, field, key, value)
	var err error
	switch resource {
	case "services":
		_, err = admin.CoreV1().Services(ns).Patch(ctx, name, types.MergePatchType, p, metav1.PatchOptions{})
	case "nodes":
		_, err = admin.CoreV1().Nodes().Patch(ctx, name, types.MergePatchType, p, metav1.PatchOptions{})
	}
	must(t, err)
}

func create[T any](_ T, err error) error { return err }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
