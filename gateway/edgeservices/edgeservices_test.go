package edgeservices

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

func addr(s string) netip.Addr        { return netip.MustParseAddr(s) }
func prefix(s string) netip.Prefix    { return netip.MustParsePrefix(s) }
func addrs(ss ...string) []netip.Addr { return mapSlice(ss, addr) }
func prefixes(ss ...string) []netip.Prefix {
	return mapSlice(ss, prefix)
}

func mapSlice[T any](ss []string, f func(string) T) []T {
	out := make([]T, 0, len(ss))
	for _, s := range ss {
		out = append(out, f(s))
	}
	return out
}

// fleet is a cluster of one cloud node (with a pod range) and two edges,
// one with a pod range.
func fleet() *nodewatch.Snapshot {
	nodes := map[string]nodewatch.Node{
		"cloud-1": {Name: "cloud-1", InternalIPs: addrs("10.0.0.5"), PodCIDRs: prefixes("10.244.0.0/24")},
		"edge-1":  {Name: "edge-1", Edge: true, InternalIPs: addrs("192.168.1.10"), PodCIDRs: prefixes("10.244.1.0/24")},
		"edge-2":  {Name: "edge-2", Edge: true, InternalIPs: addrs("192.168.2.10")},
	}
	routes := nodewatch.Resolve(nodes, nodewatch.Policy{Mode: nodewatch.ModeNodeIP}, nil, nil)
	return &nodewatch.Snapshot{Nodes: nodes, Routes: routes, Version: 1,
		Pods: nodewatch.ResolvePods(nodes, nodewatch.PodPolicy{Ranges: prefixes("10.244.0.0/16")}, nil, routes)}
}

// TestEndpointEligibility: the gateway dials a cloud node's address or pod
// only; never an edge's address or pod, the gateway host, loopback, the
// metadata service, an address a node does not hold, or an endpoint that
// names no node outside the cloud's ranges.
func TestEndpointEligibility(t *testing.T) {
	e := Eligibility{Snap: fleet(), Mode: nodewatch.ModeNodeIP, Local: addrs("10.0.0.100"),
		Denied: prefixes("192.168.0.0/16"), Extra: prefixes("172.20.0.0/16")}
	for _, tc := range []struct {
		addr, node string
		ok         bool
	}{
		{"10.244.0.7", "cloud-1", true},  // a cloud pod
		{"10.0.0.5", "cloud-1", true},    // a hostNetwork pod of a cloud node
		{"10.244.0.7", "", true},         // no node, in a cloud node's pod range
		{"172.20.3.4", "", true},         // no node, in --edge-service-cidrs
		{"10.244.1.7", "edge-1", false},  // an edge pod
		{"10.244.1.7", "cloud-1", false}, // an edge pod, whatever node it names
		{"192.168.2.10", "", false},      // an edge's address
		{"10.0.0.100", "cloud-1", false}, // the gateway host
		{"127.0.0.1", "cloud-1", false},
		{"169.254.169.254", "", false},  // the metadata service
		{"10.0.9.9", "cloud-1", false},  // not cloud-1's address nor in its range
		{"172.20.9.9", "cloud-1", true}, // in --edge-service-cidrs (IPAM without spec.podCIDRs)
		{"172.20.9.9", "edge-1", false}, // ...but never on an edge node
		{"10.0.9.9", "", false},         // no node, in no cloud range
		{"10.244.0.7", "ghost", false},  // a node the gateway does not know
		{"224.0.0.1", "", false},
	} {
		why := e.check(addr(tc.addr), tc.node)
		if (why == "") != tc.ok {
			t.Errorf("check(%s, node %q) = %q, want allowed=%v", tc.addr, tc.node, why, tc.ok)
		}
	}
}

func service(name, mark string, ports ...corev1.ServicePort) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "cloud", Name: name},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.10", Ports: ports}}
	if mark != "" {
		s.Annotations = map[string]string{Annotation: mark}
	}
	return s
}

func TestMarkedPort(t *testing.T) {
	web := corev1.ServicePort{Name: "web", Port: 80}
	admin := corev1.ServicePort{Name: "admin", Port: 9000}
	dns := corev1.ServicePort{Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}
	for _, tc := range []struct {
		svc  *corev1.Service
		port uint16
		ok   bool
	}{
		{service("s", "true", web, admin), 9000, true},
		{service("s", "web", web, admin), 80, true},
		{service("s", "80", web, admin), 80, true},
		{service("s", "web", web, admin), 9000, false}, // not among the marked ports
		{service("s", "", web), 80, false},             // not marked
		{service("s", "false", web), 80, false},
		{service("s", "true", web), 81, false}, // no such port
		{service("s", "true", dns), 53, false}, // UDP
		{nil, 80, false},
		{func() *corev1.Service { s := service("s", "true", web); s.Spec.ClusterIP = "None"; return s }(), 80, false},
	} {
		_, why := markedPort(tc.svc, tc.port)
		if (why == "") != tc.ok {
			t.Errorf("markedPort(%v, %d) = %q, want ok=%v", tc.svc, tc.port, why, tc.ok)
		}
	}
}

func slice(svc string, port int32, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "cloud", Name: svc + "-x", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("web"), Port: ptr.To(port)}},
		Endpoints:   eps,
	}
}

func endpoint(a, node string, ready bool) discoveryv1.Endpoint {
	ep := discoveryv1.Endpoint{Addresses: []string{a}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready)}}
	if node != "" {
		ep.NodeName = ptr.To(node)
	}
	return ep
}

// TestConnect runs the handler against a fake API: a marked Service is
// dialled at its cloud endpoint and nowhere else; an unmarked one, one
// steered to an edge pod, and one without ready endpoints are refused
// with their codes, and counted.
func TestConnect(t *testing.T) {
	web := corev1.ServicePort{Name: "web", Port: 80}
	client := fake.NewClientset(
		service("marked", "web", web), slice("marked", 8080, endpoint("10.244.0.7", "cloud-1", true), endpoint("10.244.0.8", "cloud-1", false)),
		service("plain", "", web), slice("plain", 8080, endpoint("10.244.0.9", "cloud-1", true)),
		service("steered", "true", web), slice("steered", 8080, endpoint("10.244.1.7", "edge-1", true), endpoint("169.254.169.254", "", true)),
		service("empty", "true", web), slice("empty", 8080, endpoint("10.244.0.10", "cloud-1", false)),
	)
	var dialled []string
	h, err := New(Options{Client: client, Snapshot: fleet, Mode: nodewatch.ModeNodeIP,
		Dial: func(_ context.Context, _, a string) (net.Conn, error) {
			dialled = append(dialled, a)
			c, s := net.Pipe()
			go func() { io.WriteString(s, "hello"); s.Close() }()
			return c, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	defer func() { cancel(); <-done }()
	testenv.Eventually(t, "informers synced", h.HasSynced)

	conn, rep, release := h.Connect(t.Context(), "edge-1", tunnel.ServiceRequest{Namespace: "cloud", Name: "marked", Port: 80})
	if rep.Code != tunnel.OK || conn == nil {
		t.Fatalf("marked Service: %v", rep)
	}
	if b, _ := io.ReadAll(conn); string(b) != "hello" {
		t.Errorf("read %q through the connection", b)
	}
	conn.Close()
	release()
	if len(dialled) != 1 || dialled[0] != "10.244.0.7:8080" {
		t.Errorf("dialled %v, want only the ready cloud endpoint 10.244.0.7:8080", dialled)
	}
	for _, tc := range []struct {
		name string
		port uint16
		code tunnel.Code
		msg  string
	}{
		{"plain", 80, tunnel.NotMarked, "no tether.io/edge-access annotation"},
		{"marked", 81, tunnel.NotMarked, "no TCP port 81"},
		{"ghost", 80, tunnel.NotMarked, "no such Service"},
		{"steered", 80, tunnel.NoEndpoints, "edge node edge-1"},
		{"empty", 80, tunnel.NoEndpoints, "no ready endpoint"},
	} {
		conn, rep, release := h.Connect(t.Context(), "edge-1", tunnel.ServiceRequest{Namespace: "cloud", Name: tc.name, Port: tc.port})
		if conn != nil || release != nil || rep.Code != tc.code || !strings.Contains(rep.Message, tc.msg) {
			t.Errorf("%s:%d: %v, %q; want %v with %q", tc.name, tc.port, rep.Code, rep.Message, tc.code, tc.msg)
		}
	}
	if len(dialled) != 1 {
		t.Errorf("refused requests dialled %v", dialled[1:])
	}
	for reason, want := range map[string]float64{ReasonNotMarked: 3, ReasonEndpointRefused: 1, ReasonNoEndpoints: 1} {
		if got := testutil.ToFloat64(h.refusals.WithLabelValues(reason)); got != want {
			t.Errorf("refusals{reason=%q} = %v, want %v", reason, got, want)
		}
	}
}

// TestBudget: an edge has at most MaxPerEdge connections open and opens
// at most PerSecond a second; another edge has its own budget.
func TestBudget(t *testing.T) {
	web := corev1.ServicePort{Name: "web", Port: 80}
	client := fake.NewClientset(service("marked", "true", web), slice("marked", 8080, endpoint("10.244.0.7", "cloud-1", true)))
	start := func(o Options) *Handler {
		o.Client, o.Snapshot = client, fleet
		o.Dial = func(context.Context, string, string) (net.Conn, error) { c, _ := net.Pipe(); return c, nil }
		h, err := New(o)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- h.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		testenv.Eventually(t, "informers synced", h.HasSynced)
		return h
	}
	req := tunnel.ServiceRequest{Namespace: "cloud", Name: "marked", Port: 80}

	h := start(Options{MaxPerEdge: 2, PerSecond: 1000})
	var releases []func()
	for range 2 {
		_, rep, release := h.Connect(t.Context(), "edge-1", req)
		if rep.Code != tunnel.OK {
			t.Fatalf("within the budget: %v", rep)
		}
		releases = append(releases, release)
	}
	if _, rep, _ := h.Connect(t.Context(), "edge-1", req); rep.Code != tunnel.Overloaded {
		t.Errorf("third open connection: %v, want overloaded", rep)
	}
	if _, rep, release := h.Connect(t.Context(), "edge-2", req); rep.Code != tunnel.OK {
		t.Errorf("another edge: %v, want OK", rep)
	} else {
		release()
	}
	releases[0]()
	if _, rep, release := h.Connect(t.Context(), "edge-1", req); rep.Code != tunnel.OK {
		t.Errorf("after a release: %v, want OK", rep)
	} else {
		release()
	}
	releases[1]()

	// One new connection per 100 s, a burst of one: the second is refused.
	h = start(Options{PerSecond: 0.01})
	_, rep, release := h.Connect(t.Context(), "edge-1", req)
	if rep.Code != tunnel.OK {
		t.Fatalf("first connection: %v", rep)
	}
	release()
	if _, rep, _ := h.Connect(t.Context(), "edge-1", req); rep.Code != tunnel.RateLimited {
		t.Errorf("second connection: %v, want rate_limited", rep)
	}
	if got := testutil.ToFloat64(h.refusals.WithLabelValues(ReasonRate)); got != 1 {
		t.Errorf("rate refusals %v, want 1", got)
	}
}
