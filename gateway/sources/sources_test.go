package sources

import (
	"bytes"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/gateway/internal/metrictest"
	"github.com/tether-edge/tether/gateway/nodewatch"
)

func prefixes(t *testing.T, s ...string) []netip.Prefix {
	t.Helper()
	ps, err := ParsePrefixes("test", s)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

func TestCheck(t *testing.T) {
	var tunnelCalls atomic.Int32
	f, err := New(Options{
		Allowed: prefixes(t, DefaultAllowed...),
		Denied:  prefixes(t, "192.168.100.0/24"),
		Tunnels: func() []netip.Addr {
			tunnelCalls.Add(1)
			return []netip.Addr{netip.MustParseAddr("10.9.9.9"), netip.MustParseAddr("203.0.113.7"), netip.MustParseAddr("127.0.0.1")}
		},
		Local: func() []netip.Addr {
			return []netip.Addr{netip.MustParseAddr("198.51.100.20"), netip.MustParseAddr("10.0.0.12")}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string]nodewatch.Node{
		"edge-1": {Name: "edge-1", Edge: true, InternalIPs: []netip.Addr{netip.MustParseAddr("10.20.0.5")}, ExternalIPs: []netip.Addr{netip.MustParseAddr("172.16.3.3")},
			PodCIDRs: prefixes(t, "10.244.1.0/24")},
		"edge-lo": {Name: "edge-lo", Edge: true, InternalIPs: []netip.Addr{netip.MustParseAddr("127.0.0.2")}},
		"cloud-1": {Name: "cloud-1", InternalIPs: []netip.Addr{netip.MustParseAddr("10.0.0.7")}, PodCIDRs: prefixes(t, "10.244.0.0/24")},
	}
	f.Update(&nodewatch.Snapshot{Nodes: nodes,
		Pods: nodewatch.ResolvePods(nodes, nodewatch.PodPolicy{Ranges: prefixes(t, "10.244.0.0/16")}, nil, nil)})
	for _, c := range []struct {
		addr, want string
	}{
		{"10.0.0.11", ""},                    // a cloud client in the VPC
		{"10.0.0.7", ""},                     // a cloud node
		{"::ffff:10.0.0.11", ""},             // the same, v4-mapped on a dual-stack socket
		{"172.31.255.1", ""},                 // RFC 1918
		{"fd00::1", ""},                      // unique local
		{"::1", ""},                          // loopback
		{"127.0.0.1", ""},                    // loopback, though an edge's tunnel comes from it
		{"127.0.0.2", ""},                    // loopback, though an edge Node has it
		{"100.64.0.2", ReasonNotAllowed},     // a site's NAT in carrier-grade NAT space
		{"198.51.100.1", ReasonNotAllowed},   // the internet
		{"198.51.100.20", ""},                // this host's own public address
		{"2001:db8::1", ReasonNotAllowed},    // the IPv6 internet
		{"192.168.100.4", ReasonEdgeRange},   // in --edge-cidrs, though RFC 1918
		{"10.20.0.5", ReasonEdgeNode},        // an edge Node's InternalIP
		{"::ffff:10.20.0.5", ReasonEdgeNode}, // the same, v4-mapped
		{"172.16.3.3", ReasonEdgeNode},       // an edge Node's ExternalIP
		{"10.9.9.9", ReasonEdgeTunnel},       // where an edge's tunnel comes from (a VPN)
		{"203.0.113.7", ReasonEdgeTunnel},    // a site's NAT: never allowed anyway
		{"10.244.1.9", ReasonEdgePod},        // an edge pod
		{"10.244.0.9", ""},                   // a cloud pod, in the same cluster CIDR
	} {
		if got := f.Check(netip.MustParseAddr(c.addr)); got != c.want {
			t.Errorf("Check(%s) = %q, want %q", c.addr, got, c.want)
		}
	}
	if n := tunnelCalls.Load(); n != 1 {
		t.Errorf("the tunnels' addresses were read %d times within %v, want once", n, TunnelsMaxAge)
	}
}

func TestNilFilterAdmitsAll(t *testing.T) {
	var f *Filter
	if got := f.Admit("proxy", &net.TCPAddr{IP: net.ParseIP("198.51.100.1"), Port: 1}); got != "" {
		t.Errorf("nil filter refused: %q", got)
	}
}

func TestParsePrefixes(t *testing.T) {
	got := prefixes(t, " 10.1.2.3/8", "192.0.2.9", "2001:db8::1/32")
	want := []string{"10.0.0.0/8", "192.0.2.9/32", "2001:db8::/32"}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i := range want {
		if got[i].String() != want[i] {
			t.Errorf("prefix %d = %s, want %s", i, got[i], want[i])
		}
	}
	if _, err := ParsePrefixes("allowed-sources", []string{"10.0.0.0/33"}); err == nil || !strings.Contains(err.Error(), "--allowed-sources") {
		t.Errorf("bad prefix: %v", err)
	}
}

// TestListenResetsRefused: the wrapped listener hands over admitted
// connections only, counts the refused ones by listener and reason and
// logs one line for a burst.
func TestListenResetsRefused(t *testing.T) {
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	f, err := New(Options{
		Allowed:    prefixes(t, "127.0.0.2/32"),
		Logger:     slog.New(slog.NewTextHandler(&logs, nil)),
		Registerer: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := f.Listen(raw, "admin")
	defer ln.Close()
	accepted := make(chan net.Addr, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c.RemoteAddr()
			c.Close()
		}
	}()
	dial := func(from string) {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := d.Dial("tcp", raw.Addr().String())
		if err != nil {
			return // reset already
		}
		// A refused connection reads a reset (or EOF), an admitted one
		// the close after Accept: either way Read returns.
		c.Read(make([]byte, 1))
		c.Close()
	}
	for range 3 {
		dial("127.0.0.1") // loopback, but not allowed here
	}
	dial("127.0.0.2")
	if a := <-accepted; a.(*net.TCPAddr).IP.String() != "127.0.0.2" {
		t.Errorf("accepted a client at %v", a)
	}
	if v, err := metrictest.Value(f.metrics.refusals, "tether_gateway_source_refusals_total", "listener=admin", "reason="+ReasonNotAllowed); err != nil || v != 3 {
		t.Errorf("tether_gateway_source_refusals_total{admin,not_allowed} = %v (%v), want 3", v, err)
	}
	if n := strings.Count(logs.String(), "client refused"); n != 1 {
		t.Errorf("%d log lines for 3 refusals within %v, want 1:\n%s", n, LogInterval, logs.String())
	}
}
