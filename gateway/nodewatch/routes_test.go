package nodewatch

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func nodeMap(ns ...Node) map[string]Node {
	m := make(map[string]Node, len(ns))
	for _, n := range ns {
		m[n.Name] = n
	}
	return m
}

var addrCmp = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

// TestResolveRefusals: each address that is not uniquely an edge's own is
// refused with its reason, in node-ip mode and in vip mode.
func TestResolveRefusals(t *testing.T) {
	gatewayHost := ips("192.0.2.10", "fd00:99::10")
	nodes := nodeMap(
		Node{Name: "edge-a1", Edge: true, InternalIPs: ips("10.1.0.11", "fd01::11"), VIP: ip("100.64.0.11")},
		// The attacker claims a cloud node's address, an external one of
		// another cloud node, the gateway host's, loopback, the metadata
		// service and an address of its own; and a cloud node's address as
		// its VIP.
		Node{Name: "edge-evil", Edge: true,
			InternalIPs: ips("10.0.0.5", "203.0.113.7", "192.0.2.10", "127.0.0.1", "169.254.169.254", "10.1.0.66"),
			VIP:         ip("10.0.0.5")},
		Node{Name: "cloud-1", InternalIPs: ips("10.0.0.5")},
		Node{Name: "cloud-2", InternalIPs: ips("10.0.0.6"), ExternalIPs: ips("203.0.113.7")},
	)

	nodeIP := Resolve(nodes, Policy{Mode: ModeNodeIP}, gatewayHost, nil)
	want := []Refusal{
		{Addr: ip("10.0.0.5"), Node: "edge-evil", Reason: ReasonCloudNode},
		{Addr: ip("127.0.0.1"), Node: "edge-evil", Reason: ReasonGatewayHost},
		{Addr: ip("169.254.169.254"), Node: "edge-evil", Reason: ReasonNotUnicast},
		{Addr: ip("192.0.2.10"), Node: "edge-evil", Reason: ReasonGatewayHost},
		{Addr: ip("203.0.113.7"), Node: "edge-evil", Reason: ReasonCloudNode},
	}
	if diff := cmp.Diff(want, nodeIP.Refused(), addrCmp); diff != "" {
		t.Errorf("node-ip refusals (-want +got):\n%s", diff)
	}
	if got := nodeIP.Of("edge-evil"); !cmp.Equal(got, ips("10.1.0.66"), addrCmp) {
		t.Errorf("edge-evil routes %v, want only its own 10.1.0.66", got)
	}
	if got := nodeIP.Of("edge-a1"); !cmp.Equal(got, ips("10.1.0.11", "fd01::11"), addrCmp) {
		t.Errorf("edge-a1 routes %v", got)
	}
	if _, ok := nodeIP.Owner(ip("10.0.0.5")); ok {
		t.Error("a cloud node's address is routed to an edge")
	}
	if got := nodeIP.Of("cloud-1"); got != nil {
		t.Errorf("cloud node routed: %v", got)
	}

	// With --edge-cidrs only the edge ranges are routed.
	ranged := Resolve(nodes, Policy{Mode: ModeNodeIP, EdgeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/24")}}, gatewayHost, nil)
	if got := ranged.Of("edge-a1"); !cmp.Equal(got, ips("10.1.0.11"), addrCmp) {
		t.Errorf("edge-a1 with edge-cidrs routes %v, want the one inside", got)
	}
	if r := ranged.Refused(); len(r) == 0 || r[len(r)-1] != (Refusal{Addr: ip("fd01::11"), Node: "edge-a1", Reason: ReasonOutsideRanges}) {
		t.Errorf("refusals with edge-cidrs: %+v", r)
	}

	// vip mode: VIPs only from --vip-cidr; they are on the gateway host
	// (tether0) by design, so that check does not apply to them.
	vipHost := append(ips("100.64.0.11"), gatewayHost...)
	vip := Resolve(nodes, Policy{Mode: ModeVIP, VIPCIDR: netip.MustParsePrefix("100.64.0.0/16")}, vipHost, nil)
	if got := vip.Of("edge-a1"); !cmp.Equal(got, ips("100.64.0.11"), addrCmp) {
		t.Errorf("vip routes of edge-a1 %v", got)
	}
	if diff := cmp.Diff([]Refusal{{Addr: ip("10.0.0.5"), Node: "edge-evil", Reason: ReasonCloudNode}}, vip.Refused(), addrCmp); diff != "" {
		t.Errorf("vip refusals (-want +got):\n%s", diff)
	}
	outside := Resolve(nodeMap(Node{Name: "e", Edge: true, VIP: ip("100.65.0.1")}), Policy{Mode: ModeVIP, VIPCIDR: netip.MustParsePrefix("100.64.0.0/16")}, nil, nil)
	if r := outside.Refused(); len(r) != 1 || r[0].Reason != ReasonOutsideRanges {
		t.Errorf("VIP outside the CIDR: %+v", r)
	}

	// Without the gateway host's addresses (tests on loopback) loopback is
	// an edge's like any other address.
	if got := Resolve(nodeMap(Node{Name: "e", Edge: true, InternalIPs: ips("127.0.0.2")}), Policy{}, nil, nil).Of("e"); len(got) != 1 {
		t.Errorf("loopback edge without a host check: %v", got)
	}
}

// TestResolveConflicts: an address two edges claim goes to the one that
// registered with it, and to none when neither or both did; never by when
// the claims came, nor by name order.
func TestResolveConflicts(t *testing.T) {
	honest := Node{Name: "edge-b", Edge: true, InternalIPs: ips("10.1.0.11"), Registered: ips("10.1.0.11")}
	// Sorts before the honest node: name order would give it the address.
	// It added the address by a status update: not registered.
	thief := Node{Name: "edge-a", Edge: true, InternalIPs: ips("10.1.0.66", "10.1.0.11"), Registered: ips("10.1.0.66")}
	p := Policy{Mode: ModeNodeIP}

	// The thief first (it squats the address before the honest node
	// registers), then both: the honest node gets it.
	squat := Resolve(nodeMap(thief), p, nil, nil)
	if n, _ := squat.Owner(ip("10.1.0.11")); n != "edge-a" {
		t.Fatalf("owner %q of an address nobody else claims", n)
	}
	arrived := Resolve(nodeMap(honest, thief), p, nil, squat)
	if n, _ := arrived.Owner(ip("10.1.0.11")); n != "edge-b" {
		t.Errorf("owner %q after the node that registered with the address arrived, want edge-b", n)
	}
	want := []Refusal{{Addr: ip("10.1.0.11"), Node: "edge-a", Reason: ReasonConflict, Holder: "edge-b"}}
	if diff := cmp.Diff(want, arrived.Refused(), addrCmp); diff != "" {
		t.Errorf("refusals (-want +got):\n%s", diff)
	}
	// The honest node first, then the thief's claim: the holder keeps it.
	first := Resolve(nodeMap(honest), p, nil, nil)
	robbed := Resolve(nodeMap(honest, thief), p, nil, first)
	if n, _ := robbed.Owner(ip("10.1.0.11")); n != "edge-b" {
		t.Errorf("owner %q after the thief's later claim, want edge-b", n)
	}
	// With no history at all (a gateway restart), the same.
	if n, _ := Resolve(nodeMap(honest, thief), p, nil, nil).Owner(ip("10.1.0.11")); n != "edge-b" {
		t.Errorf("owner %q with no history, want edge-b", n)
	}
	if got := robbed.Of("edge-a"); len(got) != 1 || got[0] != ip("10.1.0.66") {
		t.Errorf("the thief's own address: %v", got)
	}

	// Neither registered with it, or both did: nobody gets it, whoever
	// held it before; both are reported.
	for _, tc := range []struct {
		name string
		a, b Node
	}{
		{"neither", Node{Name: "edge-a", Edge: true, InternalIPs: ips("10.1.0.12")}, Node{Name: "edge-b", Edge: true, InternalIPs: ips("10.1.0.12")}},
		{"both", Node{Name: "edge-a", Edge: true, InternalIPs: ips("10.1.0.12"), Registered: ips("10.1.0.12")},
			Node{Name: "edge-b", Edge: true, InternalIPs: ips("10.1.0.12"), Registered: ips("10.1.0.12")}},
	} {
		held := Resolve(nodeMap(tc.b), p, nil, nil)
		both := Resolve(nodeMap(tc.a, tc.b), p, nil, held)
		if n, ok := both.Owner(ip("10.1.0.12")); ok {
			t.Errorf("%s registered: the contested address went to %q", tc.name, n)
		}
		if got := both.Refused(); len(got) != 2 || got[0].Holder != "" || got[1].Holder != "" || got[0].Reason != ReasonConflict {
			t.Errorf("%s registered: refusals %+v", tc.name, got)
		}
		if both.Of("edge-a") != nil || both.Of("edge-b") != nil {
			t.Errorf("%s registered: a contested address is routed", tc.name)
		}
		// When one of them lets go, the other gets it.
		after := Resolve(nodeMap(tc.b), p, nil, both)
		if n, _ := after.Owner(ip("10.1.0.12")); n != "edge-b" || len(after.Refused()) != 0 {
			t.Errorf("%s registered, after one let go: owner %q, refusals %+v", tc.name, n, after.Refused())
		}
	}

	// vip mode: the gateway assigns VIPs (a node cannot write its own
	// with node-admission.yaml), so a VIP stays with its first holder.
	vp := Policy{Mode: ModeVIP, VIPCIDR: netip.MustParsePrefix("100.64.0.0/16")}
	h := Node{Name: "edge-b", Edge: true, InternalIPs: ips("192.168.1.10"), VIP: ip("100.64.0.7")}
	v1 := Resolve(nodeMap(h), vp, nil, nil)
	v2 := Resolve(nodeMap(h, Node{Name: "edge-a", Edge: true, InternalIPs: ips("192.168.1.10"), VIP: ip("100.64.0.7")}), vp, nil, v1)
	if n, _ := v2.Owner(ip("100.64.0.7")); n != "edge-b" || len(v2.Refused()) != 1 {
		t.Errorf("vip conflict: owner %q, refusals %+v", n, v2.Refused())
	}
}

// TestResolveBound: a node claiming dozens of addresses gets MaxPerNode
// routed, the ones it registered with first; the rest are refused.
func TestResolveBound(t *testing.T) {
	var many []netip.Addr
	for i := range 40 {
		many = append(many, netip.AddrFrom4([4]byte{10, 9, 0, byte(10 + i)}))
	}
	n := Node{Name: "edge-a", Edge: true, InternalIPs: many, Registered: ips("10.9.0.30")}
	other := Node{Name: "edge-b", Edge: true, InternalIPs: ips("10.1.0.11")}
	r := Resolve(nodeMap(n, other), Policy{Mode: ModeNodeIP, MaxPerNode: 4}, nil, nil)
	if diff := cmp.Diff(ips("10.9.0.10", "10.9.0.11", "10.9.0.12", "10.9.0.30"), r.Of("edge-a"), addrCmp); diff != "" {
		t.Errorf("routed (-want +got):\n%s", diff)
	}
	if r.Len() != 5 || len(r.Refused()) != 36 {
		t.Errorf("%d routed, %d refused; want 5 and 36", r.Len(), len(r.Refused()))
	}
	for _, x := range r.Refused() {
		if x.Reason != ReasonTooMany || x.Node != "edge-a" {
			t.Fatalf("refusal %+v", x)
		}
	}
	// Unbounded with MaxPerNode 0.
	if got := Resolve(nodeMap(n), Policy{Mode: ModeNodeIP}, nil, nil).Of("edge-a"); len(got) != 40 {
		t.Errorf("%d routed without a bound", len(got))
	}
}
