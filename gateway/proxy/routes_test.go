package proxy

import (
	"net/netip"
	"testing"

	"github.com/tether-edge/tether/gateway/nodewatch"
)

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func testSnapshot() *nodewatch.Snapshot {
	nodes := []nodewatch.Node{
		{Name: "edge-1", Edge: true, InternalIPs: addrs("10.0.0.1", "fd00::1"), VIP: netip.MustParseAddr("100.64.0.1")},
		{Name: "edge-2", Edge: true, InternalIPs: addrs("10.0.0.2")},
		{Name: "edge-noaddr", Edge: true, VIP: netip.MustParseAddr("100.64.0.9")},
		{Name: "cloud-1", InternalIPs: addrs("10.1.0.1")},
		// Two sites reusing a range in node-ip mode: with no history (both
		// appear at once) neither gets the address; never the first by name.
		{Name: "site-b", Edge: true, InternalIPs: addrs("192.168.1.10")},
		{Name: "site-a", Edge: true, InternalIPs: addrs("192.168.1.10")},
		// Pod ranges, one holding edge-2's node address (refused).
		{Name: "edge-pods", Edge: true, InternalIPs: addrs("10.0.0.3"), PodCIDRs: prefixes("10.244.3.0/24", "fd10:244:0:3::/64")},
		{Name: "edge-shadow", Edge: true, PodCIDRs: prefixes("10.0.0.0/24")},
	}
	s := &nodewatch.Snapshot{Nodes: map[string]nodewatch.Node{}, Version: 1}
	for _, n := range nodes {
		s.Nodes[n.Name] = n
	}
	s.Pods = nodewatch.ResolvePods(s.Nodes, nodewatch.PodPolicy{Ranges: prefixes("10.0.0.0/8", "fd10::/16")}, nil,
		nodewatch.Resolve(s.Nodes, nodewatch.Policy{Mode: nodewatch.ModeNodeIP}, nil, nil))
	return s
}

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestRoutes(t *testing.T) {
	zones := normalizeZones([]string{"Tether.Internal.", ".edge.example"})
	nodeIP := buildRoutes(testSnapshot(), nodewatch.ModeNodeIP, zones)
	vip := buildRoutes(testSnapshot(), nodewatch.ModeVIP, zones)
	ok := func(node, dial string) route { return route{node: node, dial: netip.MustParseAddr(dial)} }
	pod := func(node, dial string) route { return route{node: node, dial: netip.MustParseAddr(dial), pod: true} }
	none := route{}

	for _, tc := range []struct {
		rt   *routes
		addr string
		want route
	}{
		{nodeIP, "10.0.0.1", ok("edge-1", "10.0.0.1")},
		{nodeIP, "::ffff:10.0.0.1", ok("edge-1", "10.0.0.1")},
		{nodeIP, "fd00::1", ok("edge-1", "fd00::1")},
		{nodeIP, "10.0.0.2", ok("edge-2", "10.0.0.2")},
		{nodeIP, "100.64.0.1", none}, // VIPs only in vip mode
		{nodeIP, "10.1.0.1", none},   // cloud nodes need no gateway
		{nodeIP, "192.168.1.10", none},
		{vip, "100.64.0.1", ok("edge-1", "10.0.0.1")}, // the edge dials the node's own address
		{vip, "10.0.0.1", none},
		{vip, "100.64.0.9", none}, // a node without addresses cannot be dialled
		// Pod addresses reach the range's owner, which dials them as they
		// are, in either mode; a node's own address wins over a range.
		{nodeIP, "10.244.3.7", pod("edge-pods", "10.244.3.7")},
		{nodeIP, "::ffff:10.244.3.7", pod("edge-pods", "10.244.3.7")},
		{nodeIP, "fd10:244:0:3::7", pod("edge-pods", "fd10:244:0:3::7")},
		{vip, "10.244.3.7", pod("edge-pods", "10.244.3.7")},
		{nodeIP, "10.244.4.7", none},
		{nodeIP, "10.0.0.3", ok("edge-pods", "10.0.0.3")},
		{nodeIP, "10.0.0.9", none}, // edge-shadow's range holds edge-1's and edge-2's addresses: refused
	} {
		if got, _ := tc.rt.addr(netip.MustParseAddr(tc.addr)); got != tc.want {
			t.Errorf("addr(%s) = %+v, want %+v", tc.addr, got, tc.want)
		}
	}

	// The node that registered with the address keeps it, though the
	// other sorts first.
	later := testSnapshot()
	b := later.Nodes["site-b"]
	b.Registered = []netip.Addr{netip.MustParseAddr("192.168.1.10")}
	later.Nodes["site-b"] = b
	later.Routes = nodewatch.Resolve(later.Nodes, nodewatch.Policy{Mode: nodewatch.ModeNodeIP}, nil, nil)
	if got, _ := buildRoutes(later, nodewatch.ModeNodeIP, zones).addr(netip.MustParseAddr("192.168.1.10")); got != ok("site-b", "192.168.1.10") {
		t.Errorf("contested address routes to %+v, want site-b, which registered with it", got)
	}
	// Routes of another mode route nothing.
	if got := buildRoutes(later, nodewatch.ModeVIP, zones); len(got.byAddr) != 0 {
		t.Errorf("node-ip routes used in vip mode: %v", got.byAddr)
	}

	for _, tc := range []struct {
		rt   *routes
		name string
		want route
	}{
		{nodeIP, "edge-1", ok("edge-1", "10.0.0.1")},
		{nodeIP, "EDGE-1.", ok("edge-1", "10.0.0.1")},
		{nodeIP, "edge-1.tether.internal", ok("edge-1", "10.0.0.1")},
		{nodeIP, "edge-2.edge.example.", ok("edge-2", "10.0.0.2")},
		{vip, "edge-1.tether.internal", ok("edge-1", "10.0.0.1")},
		{nodeIP, "10.0.0.2", ok("edge-2", "10.0.0.2")}, // an address in SNI or Host
		{nodeIP, "10.244.3.9", pod("edge-pods", "10.244.3.9")},
		{vip, "100.64.0.1", ok("edge-1", "10.0.0.1")},
		{nodeIP, "edge-1.other.zone", none},
		{nodeIP, "tether.internal", none},
		{nodeIP, "cloud-1", none},
		{nodeIP, "edge-noaddr", none},
		{nodeIP, "", none},
	} {
		if got, _ := tc.rt.name(tc.name); got != tc.want {
			t.Errorf("name(%q) = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
