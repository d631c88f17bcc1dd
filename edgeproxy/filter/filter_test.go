package filter

//lint:file-ignore SA1019 core/v1 Endpoints is deprecated but still served and read (kube-proxy, coredns and ingress controllers of older clusters); the topology filter must cover it.

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// fakeState is the in-memory ServiceLookup and NodePools.
type fakeState struct {
	keys  map[string]string // ns/name → annotation
	pools map[string]string // node → pool
}

var (
	_ ServiceLookup = fakeState{}
	_ NodePools     = fakeState{}
)

func (f fakeState) TopologyKeys(ns, name string) (string, bool) {
	v, ok := f.keys[ns+"/"+name]
	return v, ok
}
func (f fakeState) PoolOf(node string) string { return f.pools[node] }

// ep is an endpoint "node:ready" as a string: "n1", "n2!" (not ready), "" (no nodeName).
func slice(eps ...string) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "svc-abc",
		Labels: map[string]string{discoveryv1.LabelServiceName: "svc"}}}
	for i, e := range eps {
		ep := discoveryv1.Endpoint{Addresses: []string{"10.0.0." + string(rune('1'+i))}}
		if n := len(e); n > 0 && e[n-1] == '!' {
			e = e[:n-1]
			ep.Conditions.Ready = ptr.To(false)
		}
		if e != "" {
			ep.NodeName = ptr.To(e)
		}
		s.Endpoints = append(s.Endpoints, ep)
	}
	return s
}

func nodes(s *discoveryv1.EndpointSlice) []string {
	out := []string{}
	for _, e := range s.Endpoints {
		n := deref(e.NodeName)
		if e.Conditions.Ready != nil && !*e.Conditions.Ready {
			n += "!"
		}
		out = append(out, n)
	}
	return out
}

func TestEndpointSlice(t *testing.T) {
	pools := map[string]string{"me": "p1", "a": "p1", "b": "p2", "c": "p2"}
	all := []string{"me", "a", "b", "c", ""}
	tests := []struct {
		name     string
		keys     *string // nil: no annotation
		node     string
		eps      []string
		want     []string
		filtered bool
	}{
		{name: "no annotation passes", keys: nil, node: "me", eps: all, want: all},
		{name: "hostname", keys: ptr.To(KeyHostname), node: "me", eps: all, want: []string{"me"}, filtered: true},
		{name: "nodepool", keys: ptr.To(KeyNodePool), node: "me", eps: all, want: []string{"me", "a"}, filtered: true},
		{name: "zone is the pool", keys: ptr.To(KeyZone), node: "b", eps: all, want: []string{"b", "c"}, filtered: true},
		{name: "no pool means same node", keys: ptr.To(KeyNodePool), node: "x", eps: []string{"x", "a", ""}, want: []string{"x"}, filtered: true},
		{name: "no match gives empty list", keys: ptr.To(KeyHostname), node: "z", eps: all, want: []string{}, filtered: true},
		{name: "no nodeName dropped", keys: ptr.To(KeyNodePool), node: "me", eps: []string{"", "a"}, want: []string{"a"}, filtered: true},
		{name: "unknown value passes", keys: ptr.To("example.com/rack"), node: "me", eps: all, want: all},
		{name: "star alone passes", keys: ptr.To("*"), node: "me", eps: all, want: all, filtered: true},
		{name: "fallback: node has a ready one", keys: ptr.To("kubernetes.io/hostname,openyurt.io/nodepool,*"), node: "me", eps: all, want: []string{"me"}, filtered: true},
		{name: "fallback: node not ready, pool", keys: ptr.To("kubernetes.io/hostname,openyurt.io/nodepool,*"), node: "me", eps: []string{"me!", "a", "b"}, want: []string{"me!", "a"}, filtered: true},
		{name: "fallback: nothing in pool, all", keys: ptr.To("kubernetes.io/hostname, openyurt.io/nodepool, *"), node: "me", eps: []string{"b", "c!"}, want: []string{"b", "c!"}, filtered: true},
		{name: "fallback: none ready anywhere, first key", keys: ptr.To("kubernetes.io/hostname,openyurt.io/nodepool,*"), node: "me", eps: []string{"me!", "b!"}, want: []string{"me!"}, filtered: true},
		{name: "fallback without star, none ready", keys: ptr.To("kubernetes.io/hostname,openyurt.io/nodepool"), node: "me", eps: []string{"b"}, want: []string{}, filtered: true},
		{name: "fallback skips unknown keys", keys: ptr.To("foo,openyurt.io/nodepool"), node: "me", eps: all, want: []string{"me", "a"}, filtered: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := fakeState{keys: map[string]string{}, pools: pools}
			if tt.keys != nil {
				st.keys["ns/svc"] = *tt.keys
			}
			s := slice(tt.eps...)
			got := Topology{Node: tt.node, Services: st, Pools: st}.EndpointSlice(s)
			if got != tt.filtered {
				t.Errorf("filtered = %v, want %v", got, tt.filtered)
			}
			if d := cmp.Diff(tt.want, nodes(s)); d != "" {
				t.Errorf("endpoints (-want +got):\n%s", d)
			}
		})
	}
}

func TestEndpointSliceWithoutServiceLabel(t *testing.T) {
	st := fakeState{keys: map[string]string{"ns/svc": KeyHostname}}
	s := slice("a", "b")
	delete(s.Labels, discoveryv1.LabelServiceName)
	if (Topology{Node: "a", Services: st, Pools: st}).EndpointSlice(s) || len(s.Endpoints) != 2 {
		t.Fatalf("a slice of no Service was filtered: %v", nodes(s))
	}
}

func TestEndpoints(t *testing.T) {
	st := fakeState{keys: map[string]string{"ns/svc": KeyNodePool, "ns/host": KeyHostname, "ns/fb": "kubernetes.io/hostname,*"},
		pools: map[string]string{"me": "p1", "a": "p1", "b": "p2"}}
	addr := func(ip, node string) corev1.EndpointAddress {
		a := corev1.EndpointAddress{IP: ip}
		if node != "" {
			a.NodeName = ptr.To(node)
		}
		return a
	}
	ports := []corev1.EndpointPort{{Port: 80}}
	mk := func(name string) *corev1.Endpoints {
		return &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}, Subsets: []corev1.EndpointSubset{
			{Addresses: []corev1.EndpointAddress{addr("1", "me"), addr("2", "b"), addr("3", "")}, NotReadyAddresses: []corev1.EndpointAddress{addr("4", "a")}, Ports: ports},
			{Addresses: []corev1.EndpointAddress{addr("5", "b")}, Ports: []corev1.EndpointPort{{Port: 81}}},
		}}
	}
	tests := []struct {
		name, svc, node string
		want            []corev1.EndpointSubset
	}{
		{name: "pool", svc: "svc", node: "me", want: []corev1.EndpointSubset{
			{Addresses: []corev1.EndpointAddress{addr("1", "me")}, NotReadyAddresses: []corev1.EndpointAddress{addr("4", "a")}, Ports: ports}}},
		{name: "hostname, no match: no subsets", svc: "host", node: "zz", want: nil},
		{name: "fallback to all", svc: "fb", node: "zz", want: mk("fb").Subsets},
		{name: "no annotation", svc: "other", node: "me", want: mk("other").Subsets},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := mk(tt.svc)
			Topology{Node: tt.node, Services: st, Pools: st}.Endpoints(e)
			if d := cmp.Diff(tt.want, e.Subsets); d != "" {
				t.Errorf("subsets (-want +got):\n%s", d)
			}
		})
	}
}

func TestIsPoolKey(t *testing.T) {
	for keys, want := range map[string]bool{KeyHostname: false, KeyZone: true, "kubernetes.io/hostname, openyurt.io/nodepool,*": true, "*": false} {
		if IsPoolKey(keys) != want {
			t.Errorf("IsPoolKey(%q) = %v", keys, !want)
		}
	}
}
