package dns

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/miekg/dns"

	"github.com/tether-edge/tether/gateway/nodewatch"
)

// BenchmarkServeDNS measures one A query for one of 10,000 edge nodes,
// through the raw path the UDP and TCP loops use and through ServeDNS (the
// dns.Handler path), without sockets. tools/bench-dns.sh measures the
// whole server under dnsperf.
func BenchmarkServeDNS(b *testing.B) {
	const n = 10000
	snap := &nodewatch.Snapshot{Nodes: make(map[string]nodewatch.Node, n), Version: 1}
	for i := range n {
		name := fmt.Sprintf("edge-%05d", i)
		snap.Nodes[name] = nodewatch.Node{Name: name, Edge: true,
			InternalIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})}}
	}
	s, err := New(Options{Zones: []string{"tether.internal."}})
	if err != nil {
		b.Fatal(err)
	}
	s.Update(snap)
	q := query("edge-04711.tether.internal.", dns.TypeA, 1232)
	raw, err := q.Pack()
	if err != nil {
		b.Fatal(err)
	}

	b.Run("raw", func(b *testing.B) {
		ss := newSession()
		b.ReportAllocs()
		for b.Loop() {
			if s.handle(ss, raw, overUDP, testSource) == nil {
				b.Fatal("no answer")
			}
		}
	})
	b.Run("handler", func(b *testing.B) {
		w := &recorder{}
		b.ReportAllocs()
		for b.Loop() {
			s.ServeDNS(w, q)
		}
	})
	b.Run("update", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.Update(snap)
		}
	})
}
