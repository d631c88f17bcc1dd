package netrules

import (
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestStaleFilter(t *testing.T) {
	prev := mustNormalize(t, goldenDesired)
	flow := func(proto uint8, dst string) *netlink.ConntrackFlow {
		ap := netip.MustParseAddrPort(dst)
		f := &netlink.ConntrackFlow{}
		f.Forward.Protocol = proto
		f.Forward.DstIP = net.IP(ap.Addr().AsSlice())
		f.Forward.DstPort = ap.Port()
		return f
	}
	removedNode := goldenDesired
	removedNode.Edges = map[string][]netip.Addr{"edge-b": goldenDesired.Edges["edge-b"]}
	removedPort := goldenDesired
	removedPort.Ports = []uint16{10250, 10255}
	movedListener := goldenDesired
	movedListener.ProxyPort = 10264

	for _, tc := range []struct {
		name  string
		next  Desired
		stale map[string]bool // flow destination -> deleted
	}{
		{"node removed", removedNode, map[string]bool{
			"10.20.0.5:10250":    true,
			"[fd00:20::5]:8080":  true,
			"10.20.0.6:10250":    false, // still redirected
			"10.20.0.5:10251":    false, // never redirected
			"10.30.0.1:10250":    false, // never an edge
			"192.168.7.10:10255": true,
		}},
		{"port removed", removedPort, map[string]bool{
			"10.20.0.5:8080":  true,
			"10.20.0.5:10250": false,
		}},
		{"listener moved", movedListener, map[string]bool{
			"10.20.0.5:10250": true,
			"10.20.0.5:10251": false,
		}},
	} {
		f := newStaleFilter(prev, mustNormalize(t, tc.next))
		if f == nil {
			t.Errorf("%s: nothing stale", tc.name)
			continue
		}
		for dst, want := range tc.stale {
			if got := f.MatchConntrackFlow(flow(unix.IPPROTO_TCP, dst)); got != want {
				t.Errorf("%s: TCP to %s: stale %v, want %v", tc.name, dst, got, want)
			}
			if f.MatchConntrackFlow(flow(unix.IPPROTO_UDP, dst)) {
				t.Errorf("%s: UDP to %s matched", tc.name, dst)
			}
		}
	}
	if f := newStaleFilter(prev, prev); f != nil {
		t.Errorf("same state: filter %+v, want none", f)
	}
	added := goldenDesired
	added.Edges = map[string][]netip.Addr{"new": {netip.MustParseAddr("10.1.1.1")}}
	for k, v := range goldenDesired.Edges {
		added.Edges[k] = v
	}
	if f := newStaleFilter(prev, mustNormalize(t, added)); f != nil {
		t.Errorf("node added: filter %+v, want none", f)
	}
	if f := newStaleFilter(prev, nil); f == nil || !f.v4 || !f.v6 {
		t.Errorf("cleanup: filter %+v, want all of both families", f)
	}
}
