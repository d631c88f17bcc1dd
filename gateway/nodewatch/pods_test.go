package nodewatch

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func pfx(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ss))
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

var prefixCmp = cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })

var edgePods = PodPolicy{Ranges: pfx("10.244.0.0/16", "fd10::/16")}

// TestResolvePodsRefusals: every pod range that is not uniquely an edge's
// own, inside --edge-pod-cidrs and no wider than allowed is refused with
// its reason, and the addresses it would shadow reach nobody through it.
func TestResolvePodsRefusals(t *testing.T) {
	gatewayHost := ips("192.0.2.10", "10.244.200.1")
	nodes := nodeMap(
		Node{Name: "edge-a", Edge: true, InternalIPs: ips("192.168.1.10"), PodCIDRs: pfx("10.244.1.0/24", "fd10:244:0:1::/64")},
		// A range outside --edge-pod-cidrs, one wider than /16, one holding
		// a cloud node's range, one holding the gateway host's cni0.
		Node{Name: "edge-out", Edge: true, PodCIDRs: pfx("10.96.0.0/24")},
		Node{Name: "edge-wide", Edge: true, PodCIDRs: pfx("fd10:244::/47")},
		Node{Name: "edge-cloudy", Edge: true, PodCIDRs: pfx("10.244.100.0/22")},
		Node{Name: "edge-gw", Edge: true, PodCIDRs: pfx("10.244.200.0/24")},
		// Two edges given the same range, and one given a range holding
		// another's: all of them refused.
		Node{Name: "edge-b", Edge: true, PodCIDRs: pfx("10.244.2.0/24")},
		Node{Name: "edge-c", Edge: true, PodCIDRs: pfx("10.244.2.0/24")},
		Node{Name: "edge-d", Edge: true, PodCIDRs: pfx("10.244.8.0/21")},
		Node{Name: "edge-e", Edge: true, PodCIDRs: pfx("10.244.9.0/24")},
		// A range holding another edge's routed node address.
		Node{Name: "edge-f", Edge: true, InternalIPs: ips("10.244.20.5")},
		Node{Name: "edge-g", Edge: true, PodCIDRs: pfx("10.244.20.0/24")},
		Node{Name: "cloud-1", InternalIPs: ips("10.0.0.5"), PodCIDRs: pfx("10.244.101.0/24")},
	)
	routes := Resolve(nodes, Policy{Mode: ModeNodeIP}, gatewayHost, nil)
	pods := ResolvePods(nodes, edgePods, gatewayHost, routes)
	want := []PodRefusal{
		{Prefix: netip.MustParsePrefix("10.96.0.0/24"), Node: "edge-out", Reason: ReasonOutsideRanges},
		{Prefix: netip.MustParsePrefix("10.244.2.0/24"), Node: "edge-b", Reason: ReasonConflict, With: "edge-c"},
		{Prefix: netip.MustParsePrefix("10.244.2.0/24"), Node: "edge-c", Reason: ReasonConflict, With: "edge-b"},
		{Prefix: netip.MustParsePrefix("10.244.8.0/21"), Node: "edge-d", Reason: ReasonConflict, With: "edge-e"},
		{Prefix: netip.MustParsePrefix("10.244.9.0/24"), Node: "edge-e", Reason: ReasonConflict, With: "edge-d"},
		{Prefix: netip.MustParsePrefix("10.244.20.0/24"), Node: "edge-g", Reason: ReasonConflict, With: "edge-f"},
		{Prefix: netip.MustParsePrefix("10.244.100.0/22"), Node: "edge-cloudy", Reason: ReasonCloudNode, With: "cloud-1"},
		{Prefix: netip.MustParsePrefix("10.244.200.0/24"), Node: "edge-gw", Reason: ReasonGatewayHost},
		{Prefix: netip.MustParsePrefix("fd10:244::/47"), Node: "edge-wide", Reason: ReasonTooWide},
	}
	if diff := cmp.Diff(want, pods.Refused(), prefixCmp); diff != "" {
		t.Errorf("refusals (-want +got):\n%s", diff)
	}
	if got := pods.Of("edge-a"); !cmp.Equal(got, pfx("10.244.1.0/24", "fd10:244:0:1::/64"), prefixCmp) {
		t.Errorf("edge-a routes %v", got)
	}
	if pods.Len() != 2 {
		t.Errorf("%d ranges routed, want edge-a's 2: %v", pods.Len(), pods.ByNode())
	}
	for _, a := range ips("10.244.2.7", "10.244.9.1", "10.244.101.9", "10.244.200.1", "10.96.0.1", "10.244.20.9") {
		if n, _, ok := pods.Owner(a); ok {
			t.Errorf("%s is routed to %s, want nobody", a, n)
		}
	}
	for a, wantRange := range map[string]string{"10.244.1.7": "10.244.1.0/24", "fd10:244:0:1::abcd": "fd10:244:0:1::/64", "::ffff:10.244.1.200": "10.244.1.0/24"} {
		n, in, ok := pods.Owner(netip.MustParseAddr(a))
		if !ok || n != "edge-a" || in != netip.MustParsePrefix(wantRange) {
			t.Errorf("Owner(%s) = %q, %s, %v; want edge-a, %s", a, n, in, ok, wantRange)
		}
	}
}

// TestResolvePodsDisabled: without --edge-pod-cidrs no range is routed and
// none is refused.
func TestResolvePodsDisabled(t *testing.T) {
	nodes := nodeMap(Node{Name: "edge-a", Edge: true, PodCIDRs: pfx("10.244.1.0/24")})
	pods := ResolvePods(nodes, PodPolicy{}, nil, nil)
	if pods.Len() != 0 || len(pods.Refused()) != 0 {
		t.Errorf("routes %v, refusals %v; want none", pods.ByNode(), pods.Refused())
	}
	if _, _, ok := pods.Owner(netip.MustParseAddr("10.244.1.1")); ok {
		t.Error("a pod address is routed with pod routing off")
	}
	var nilRoutes *PodRoutes
	if _, _, ok := nilRoutes.Owner(netip.MustParseAddr("10.244.1.1")); ok || nilRoutes.Len() != 0 {
		t.Error("nil PodRoutes routes something")
	}
}

// TestResolvePodsFleet: 10,000 edges with a /24 and a /64 each resolve
// without refusals, every address finds its own node, and the result does
// not depend on map order.
func TestResolvePodsFleet(t *testing.T) {
	nodes := map[string]Node{}
	for i := range 10000 {
		name := fmt.Sprintf("edge-%05d", i)
		nodes[name] = Node{Name: name, Edge: true,
			InternalIPs: ips(fmt.Sprintf("192.168.%d.%d", i/250, i%250+1)),
			PodCIDRs:    pfx(fmt.Sprintf("10.%d.%d.0/24", 100+i/256, i%256), fmt.Sprintf("fd10:244:0:%x::/64", i))}
	}
	p := PodPolicy{Ranges: pfx("10.0.0.0/8", "fd10:244::/48")}
	routes := Resolve(nodes, Policy{Mode: ModeNodeIP}, nil, nil)
	pods := ResolvePods(nodes, p, nil, routes)
	if len(pods.Refused()) != 0 || pods.Len() != 20000 {
		t.Fatalf("%d routed, refusals %v", pods.Len(), pods.Refused()[:min(3, len(pods.Refused()))])
	}
	for _, i := range []int{0, 1, 255, 256, 9999} {
		name := fmt.Sprintf("edge-%05d", i)
		for _, a := range []string{fmt.Sprintf("10.%d.%d.77", 100+i/256, i%256), fmt.Sprintf("fd10:244:0:%x::77", i)} {
			if n, _, ok := pods.Owner(netip.MustParseAddr(a)); !ok || n != name {
				t.Errorf("Owner(%s) = %q, %v; want %s", a, n, ok, name)
			}
		}
	}
	again := ResolvePods(nodes, p, nil, routes)
	if !cmp.Equal(pods.ByNode(), again.ByNode(), prefixCmp) {
		t.Error("two resolutions of the same nodes differ")
	}
}

// TestPodCIDRsFromNode: spec.podCIDRs is read, spec.podCIDR stands in for
// an older object, a bad range is warned about and skipped.
func TestPodCIDRsFromNode(t *testing.T) {
	for _, tc := range []struct {
		spec    corev1.NodeSpec
		want    []netip.Prefix
		warning bool
	}{
		{spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24", "fd10::/64"}}, want: pfx("10.244.1.0/24", "fd10::/64")},
		{spec: corev1.NodeSpec{PodCIDR: "10.244.2.0/24"}, want: pfx("10.244.2.0/24")},
		{spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.3.9/24"}}, want: pfx("10.244.3.0/24")},
		{spec: corev1.NodeSpec{PodCIDRs: []string{"bogus", "10.244.4.0/24"}}, want: pfx("10.244.4.0/24"), warning: true},
		{spec: corev1.NodeSpec{}, want: nil},
	} {
		n, w := fromObject(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}, Spec: tc.spec}, DefaultEdgeSelector())
		if !cmp.Equal(n.PodCIDRs, tc.want, prefixCmp) || (w != "") != tc.warning {
			t.Errorf("%+v: got %v, warning %q; want %v, warning %v", tc.spec, n.PodCIDRs, w, tc.want, tc.warning)
		}
	}
}

func BenchmarkResolvePods(b *testing.B) {
	nodes := map[string]Node{}
	for i := range 10000 {
		name := fmt.Sprintf("edge-%05d", i)
		nodes[name] = Node{Name: name, Edge: true, InternalIPs: ips(fmt.Sprintf("192.168.%d.%d", i/250, i%250+1)),
			PodCIDRs: pfx(fmt.Sprintf("10.%d.%d.0/24", 100+i/256, i%256))}
	}
	p := PodPolicy{Ranges: pfx("10.0.0.0/8")}
	routes := Resolve(nodes, Policy{Mode: ModeNodeIP}, nil, nil)
	for b.Loop() {
		ResolvePods(nodes, p, nil, routes)
	}
}
