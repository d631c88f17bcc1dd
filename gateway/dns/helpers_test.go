package dns

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/miekg/dns"

	"github.com/tether-edge/tether/gateway/nodewatch"
)

// testSource is the client address of queries sent through handle.
var testSource = netip.MustParseAddr("192.0.2.53")

// testSnapshot returns the nodes most tests serve.
func testSnapshot() *nodewatch.Snapshot {
	many := make([]netip.Addr, 60) // 1,000 bytes compressed, 2,000 not
	for i := range many {
		many[i] = netip.AddrFrom4([4]byte{10, 9, byte(i / 250), byte(1 + i%250)})
	}
	nodes := []nodewatch.Node{
		{Name: "edge-1", Edge: true, Pool: "shop", InternalIPs: addrs("10.0.0.1", "fd00::1"), VIP: netip.MustParseAddr("100.64.0.1")},
		{Name: "edge-2", Edge: true, InternalIPs: addrs("10.0.0.2"), VIP: netip.MustParseAddr("fd64::2")},
		{Name: "n1", Edge: true, InternalIPs: addrs("10.0.0.3")},
		{Name: "ip-10-0-0-9.ec2.internal", Edge: true, InternalIPs: addrs("10.0.0.9")},
		{Name: "many", Edge: true, InternalIPs: many},
		{Name: "cloud-1", InternalIPs: addrs("172.16.0.1")},
	}
	s := &nodewatch.Snapshot{Nodes: map[string]nodewatch.Node{}, Version: 1}
	for _, n := range nodes {
		s.Nodes[n.Name] = n
	}
	return s
}

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func newTestServer(t testing.TB, opts Options) *Server {
	t.Helper()
	if opts.Zones == nil {
		opts.Zones = []string{"tether.internal"}
	}
	if err := opts.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Update(testSnapshot())
	return s
}

// query returns a query for name and type with RD set and, when bufsize is
// not 0, an EDNS0 OPT record offering that size.
func query(name string, qtype uint16, bufsize uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.Id = 0x1234
	if bufsize != 0 {
		m.SetEdns0(bufsize, false)
	}
	return m
}

// exchange sends m through the raw query path over via and unpacks the
// answer; nil if there was none.
func exchange(t testing.TB, s *Server, m *dns.Msg, via transport) (*dns.Msg, int) {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	out := s.handle(newSession(), b, via, testSource)
	if out == nil {
		return nil, 0
	}
	if via == overTCP {
		if n := int(out[0])<<8 | int(out[1]); n != len(out)-2 {
			t.Fatalf("tcp length prefix %d, message %d bytes", n, len(out)-2)
		}
		out = out[2:]
	}
	r := new(dns.Msg)
	if err := r.Unpack(out); err != nil {
		t.Fatalf("unpack response: %v", err)
	}
	return r, len(out)
}

// rrStrings renders records without TTLs' tabs, for comparison.
func rrStrings(rrs []dns.RR) []string {
	var out []string
	for _, rr := range rrs {
		out = append(out, fmt.Sprint(rr))
	}
	return out
}
