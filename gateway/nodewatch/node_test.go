package nodewatch

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

func TestFromObject(t *testing.T) {
	custom, err := labels.Parse("site in (a,b)")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		obj      *corev1.Node
		selector labels.Selector
		want     Node
		warning  bool
	}{
		{
			name: "edge node with pool, addresses and VIP",
			obj: node("edge-1", map[string]string{EdgeLabel: "true", PoolLabel: "shop"},
				map[string]string{VIPAnnotation: "100.64.0.7"},
				addr(corev1.NodeHostName, "edge-1"), addr(corev1.NodeInternalIP, "10.0.0.1"),
				addr(corev1.NodeExternalIP, "203.0.113.1"), addr(corev1.NodeInternalIP, "fd00::1")),
			want: Node{Name: "edge-1", Edge: true, Pool: "shop", InternalIPs: ips("10.0.0.1", "fd00::1"), ExternalIPs: ips("203.0.113.1"), VIP: ip("100.64.0.7")},
		},
		{
			name: "edge label must be true",
			obj:  node("n", map[string]string{EdgeLabel: "false"}, nil, addr(corev1.NodeInternalIP, "10.0.0.2")),
			want: Node{Name: "n", InternalIPs: ips("10.0.0.2")},
		},
		{
			name:     "custom selector",
			obj:      node("n", map[string]string{"site": "b"}, nil),
			selector: custom,
			want:     Node{Name: "n", Edge: true},
		},
		{
			name:     "custom selector replaces the default",
			obj:      node("n", map[string]string{EdgeLabel: "true", "site": "c"}, nil),
			selector: custom,
			want:     Node{Name: "n"},
		},
		{
			name: "ExternalIP stands in when there is no InternalIP",
			obj:  node("n", nil, nil, addr(corev1.NodeExternalIP, "203.0.113.9"), addr(corev1.NodeHostName, "n")),
			want: Node{Name: "n", InternalIPs: ips("203.0.113.9"), ExternalIPs: ips("203.0.113.9")},
		},
		{
			name: "duplicates dropped, IPv4-mapped unmapped, invalid ignored with a warning",
			obj: node("n", nil, nil, addr(corev1.NodeInternalIP, "10.0.0.3"), addr(corev1.NodeInternalIP, "::ffff:10.0.0.3"),
				addr(corev1.NodeInternalIP, "not-an-ip"), addr(corev1.NodeInternalIP, "fe80::1%eth0"), addr(corev1.NodeInternalIP, "0.0.0.0")),
			want:    Node{Name: "n", InternalIPs: ips("10.0.0.3")},
			warning: true,
		},
		{
			name: "registered addresses; an empty list; a bad one ignored with a warning",
			obj: node("n", nil, map[string]string{RegisteredAnnotation: "10.0.0.4, ::ffff:10.0.0.5,,10.0.0.4,nope"},
				addr(corev1.NodeInternalIP, "10.0.0.4")),
			want:    Node{Name: "n", InternalIPs: ips("10.0.0.4"), Registered: ips("10.0.0.4", "10.0.0.5")},
			warning: true,
		},
		{
			name: "registered with no address",
			obj:  node("n", nil, map[string]string{RegisteredAnnotation: ""}, addr(corev1.NodeInternalIP, "10.0.0.4")),
			want: Node{Name: "n", InternalIPs: ips("10.0.0.4")},
		},
		{
			name:    "invalid VIP ignored with a warning",
			obj:     node("n", map[string]string{EdgeLabel: "true"}, map[string]string{VIPAnnotation: "100.64.0.300"}),
			want:    Node{Name: "n", Edge: true},
			warning: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sel := tc.selector
			if sel == nil {
				sel = DefaultEdgeSelector()
			}
			got, warning := fromObject(tc.obj, sel)
			if diff := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
				t.Errorf("node (-want +got):\n%s", diff)
			}
			if (warning != "") != tc.warning {
				t.Errorf("warning %q, want one: %v", warning, tc.warning)
			}
		})
	}
}

func TestReach(t *testing.T) {
	edge := Node{Name: "e", Edge: true, InternalIPs: ips("10.0.0.1", "fd00::1"), VIP: ip("100.64.0.1")}
	noVIP := Node{Name: "e2", Edge: true, InternalIPs: ips("10.0.0.2")}
	cloud := Node{Name: "c", InternalIPs: ips("172.16.0.1"), VIP: ip("100.64.0.9")}
	tests := []struct {
		n    Node
		mode Mode
		want []netip.Addr
	}{
		{edge, ModeNodeIP, ips("10.0.0.1", "fd00::1")},
		{edge, ModeVIP, ips("100.64.0.1")},
		{noVIP, ModeVIP, nil},
		{cloud, ModeNodeIP, ips("172.16.0.1")},
		{cloud, ModeVIP, ips("172.16.0.1")}, // cloud nodes need no gateway
	}
	for _, tc := range tests {
		if got := tc.n.Reach(tc.mode); !cmp.Equal(got, tc.want, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })) {
			t.Errorf("%s.Reach(%s) = %v, want %v", tc.n.Name, tc.mode, got, tc.want)
		}
	}
}

func TestParseMode(t *testing.T) {
	for _, s := range []string{"node-ip", "vip"} {
		if m, err := ParseMode(s); err != nil || string(m) != s {
			t.Errorf("ParseMode(%q) = %q, %v", s, m, err)
		}
	}
	if _, err := ParseMode("nodeip"); err == nil {
		t.Error("ParseMode(nodeip) did not fail")
	}
}

func node(name string, labels, annotations map[string]string, as ...corev1.NodeAddress) *corev1.Node {
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
		Status:     corev1.NodeStatus{Addresses: as},
	}
}

func addr(typ corev1.NodeAddressType, a string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: typ, Address: a}
}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func ips(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, ip(s))
	}
	return out
}
