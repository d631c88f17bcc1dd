package dns

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/miekg/dns"

	"github.com/tether-edge/tether/gateway/nodewatch"
)

func TestAnswers(t *testing.T) {
	const soa = "tether.internal.\t5\tIN\tSOA\tns.dns.tether.internal. hostmaster.tether.internal. SERIAL 7200 1800 86400 5"
	tests := []struct {
		name    string
		opts    Options
		q       *dns.Msg
		rcode   int
		aa      bool
		answer  []string
		ns      []string // SERIAL stands for the SOA serial
		noReply bool
	}{
		{
			name:   "A of a bare node name",
			q:      query("edge-1.", dns.TypeA, 0),
			rcode:  dns.RcodeSuccess,
			aa:     true,
			answer: []string{"edge-1.\t5\tIN\tA\t10.0.0.1"},
		},
		{
			name:   "AAAA of a name in the zone",
			q:      query("edge-1.tether.internal.", dns.TypeAAAA, 0),
			rcode:  dns.RcodeSuccess,
			aa:     true,
			answer: []string{"edge-1.tether.internal.\t5\tIN\tAAAA\tfd00::1"},
		},
		{
			name:   "exact names: n1 does not answer for edge-n1 or x.n1",
			q:      query("n1.tether.internal.", dns.TypeA, 0),
			rcode:  dns.RcodeSuccess,
			aa:     true,
			answer: []string{"n1.tether.internal.\t5\tIN\tA\t10.0.0.3"},
		},
		{
			name:  "unknown name under a node name is NXDOMAIN",
			q:     query("x.n1.tether.internal.", dns.TypeA, 0),
			rcode: dns.RcodeNameError,
			aa:    true,
			ns:    []string{soa},
		},
		{
			name:   "question case is preserved (0x20)",
			q:      query("EdGe-1.Tether.Internal.", dns.TypeA, 0),
			rcode:  dns.RcodeSuccess,
			aa:     true,
			answer: []string{"EdGe-1.Tether.Internal.\t5\tIN\tA\t10.0.0.1"},
		},
		{
			name:   "VIP mode answers the VIP",
			opts:   Options{Mode: nodewatch.ModeVIP},
			q:      query("edge-1.tether.internal.", dns.TypeA, 0),
			rcode:  dns.RcodeSuccess,
			aa:     true,
			answer: []string{"edge-1.tether.internal.\t5\tIN\tA\t100.64.0.1"},
		},
		{
			name:  "VIP mode: an IPv4 VIP has no AAAA (NODATA)",
			opts:  Options{Mode: nodewatch.ModeVIP},
			q:     query("edge-1.tether.internal.", dns.TypeAAAA, 0),
			rcode: dns.RcodeSuccess,
			aa:    true,
			ns:    []string{soa},
		},
		{
			name:  "VIP mode: a node without VIP is not answered",
			opts:  Options{Mode: nodewatch.ModeVIP},
			q:     query("n1.tether.internal.", dns.TypeA, 0),
			rcode: dns.RcodeNameError,
			aa:    true,
			ns:    []string{soa},
		},
		{
			name:   "PTR of an IPv4 VIP",
			opts:   Options{Mode: nodewatch.ModeVIP},
			q:      query("1.0.64.100.in-addr.arpa.", dns.TypePTR, 0),
			rcode:  dns.RcodeSuccess,
			aa:     true,
			answer: []string{"1.0.64.100.in-addr.arpa.\t5\tIN\tPTR\tedge-1.tether.internal."},
		},
		{
			name:   "PTR of an IPv6 VIP",
			opts:   Options{Mode: nodewatch.ModeVIP},
			q:      query("2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.4.6.d.f.ip6.arpa.", dns.TypePTR, 0),
			rcode:  dns.RcodeSuccess,
			aa:     true,
			answer: []string{"2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.4.6.d.f.ip6.arpa.\t5\tIN\tPTR\tedge-2.tether.internal."},
		},
		{
			name:  "PTR of a node IP (not a VIP) is refused",
			opts:  Options{Mode: nodewatch.ModeVIP},
			q:     query("1.0.0.10.in-addr.arpa.", dns.TypePTR, 0),
			rcode: dns.RcodeRefused,
		},
		{
			name:  "no PTR in node-ip mode",
			q:     query("1.0.64.100.in-addr.arpa.", dns.TypePTR, 0),
			rcode: dns.RcodeRefused,
		},
		{
			name:  "PTR inside a reverse zone we serve is NXDOMAIN",
			opts:  Options{Zones: []string{"tether.internal.", "64.100.in-addr.arpa."}, Mode: nodewatch.ModeVIP},
			q:     query("9.0.64.100.in-addr.arpa.", dns.TypePTR, 0),
			rcode: dns.RcodeNameError,
			aa:    true,
			ns:    []string{"64.100.in-addr.arpa.\t5\tIN\tSOA\tns.dns.64.100.in-addr.arpa. hostmaster.64.100.in-addr.arpa. SERIAL 7200 1800 86400 5"},
		},
		{
			name:   "SOA at the apex",
			q:      query("tether.internal.", dns.TypeSOA, 0),
			rcode:  dns.RcodeSuccess,
			aa:     true,
			answer: []string{soa},
		},
		{
			name:   "NS at the apex",
			q:      query("TETHER.internal.", dns.TypeNS, 0),
			rcode:  dns.RcodeSuccess,
			aa:     true,
			answer: []string{"TETHER.internal.\t5\tIN\tNS\tns.dns.tether.internal."},
		},
		{
			name:   "name server address when given",
			opts:   Options{NSAddrs: addrs("192.0.2.53")},
			q:      query("ns.dns.tether.internal.", dns.TypeA, 0),
			rcode:  dns.RcodeSuccess,
			aa:     true,
			answer: []string{"ns.dns.tether.internal.\t5\tIN\tA\t192.0.2.53"},
		},
		{
			name:  "A at the apex is NODATA",
			q:     query("tether.internal.", dns.TypeA, 0),
			rcode: dns.RcodeSuccess,
			aa:    true,
			ns:    []string{soa},
		},
		{
			name:  "unknown name in the zone is NXDOMAIN with the SOA",
			q:     query("edge-404.tether.internal.", dns.TypeA, 0),
			rcode: dns.RcodeNameError,
			aa:    true,
			ns:    []string{soa},
		},
		{
			name:  "empty non-terminal of a dotted node name is NODATA",
			q:     query("ec2.internal.tether.internal.", dns.TypeA, 0),
			rcode: dns.RcodeSuccess,
			aa:    true,
			ns:    []string{soa},
		},
		{
			name:   "dotted node name, bare",
			q:      query("ip-10-0-0-9.ec2.internal.", dns.TypeA, 0),
			rcode:  dns.RcodeSuccess,
			aa:     true,
			answer: []string{"ip-10-0-0-9.ec2.internal.\t5\tIN\tA\t10.0.0.9"},
		},
		{
			name:  "MX of a node is NODATA",
			q:     query("edge-1.tether.internal.", dns.TypeMX, 0),
			rcode: dns.RcodeSuccess,
			aa:    true,
			ns:    []string{soa},
		},
		{
			name:  "bare name that is not a node is refused",
			q:     query("edge-404.", dns.TypeA, 0),
			rcode: dns.RcodeRefused,
		},
		{
			name:  "a TLD is refused",
			q:     query("com.", dns.TypeNS, 0),
			rcode: dns.RcodeRefused,
		},
		{
			name:  "outside names are refused, never recursed",
			q:     query("example.com.", dns.TypeA, 0),
			rcode: dns.RcodeRefused,
		},
		{
			name:  "cloud node not answered by default",
			q:     query("cloud-1.tether.internal.", dns.TypeA, 0),
			rcode: dns.RcodeNameError,
			aa:    true,
			ns:    []string{soa},
		},
		{
			name:   "cloud node answered with its own address when enabled, also in VIP mode",
			opts:   Options{CloudNodes: true, Mode: nodewatch.ModeVIP},
			q:      query("cloud-1.", dns.TypeA, 0),
			rcode:  dns.RcodeSuccess,
			aa:     true,
			answer: []string{"cloud-1.\t5\tIN\tA\t172.16.0.1"},
		},
		{
			name:   "TTL is configurable",
			opts:   Options{TTL: 30 * time.Second},
			q:      query("edge-2.", dns.TypeA, 0),
			rcode:  dns.RcodeSuccess,
			aa:     true,
			answer: []string{"edge-2.\t30\tIN\tA\t10.0.0.2"},
		},
		{
			name:  "zone transfer refused",
			q:     query("tether.internal.", dns.TypeAXFR, 0),
			rcode: dns.RcodeRefused,
		},
		{
			name: "class CHAOS refused",
			q: func() *dns.Msg {
				m := query("version.bind.", dns.TypeTXT, 0)
				m.Question[0].Qclass = dns.ClassCHAOS
				return m
			}(),
			rcode: dns.RcodeRefused,
		},
		{
			name:  "opcode UPDATE not implemented",
			q:     func() *dns.Msg { m := query("tether.internal.", dns.TypeSOA, 0); m.Opcode = dns.OpcodeUpdate; return m }(),
			rcode: dns.RcodeNotImplemented,
		},
		{
			name: "two questions is a format error",
			q: func() *dns.Msg {
				m := query("edge-1.", dns.TypeA, 0)
				m.Question = append(m.Question, m.Question[0])
				return m
			}(),
			rcode: dns.RcodeFormatError,
		},
		{
			name:    "a response gets no answer",
			q:       func() *dns.Msg { m := query("edge-1.", dns.TypeA, 0); m.Response = true; return m }(),
			noReply: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestServer(t, tc.opts)
			for _, via := range []transport{overUDP, overTCP} {
				r, _ := exchange(t, s, tc.q, via)
				if tc.noReply {
					if r != nil {
						t.Fatalf("%v: got a reply to a response:\n%v", via, r)
					}
					continue
				}
				if r == nil {
					t.Fatalf("%v: no reply", via)
				}
				if r.Id != tc.q.Id || !r.Response || r.RecursionAvailable || !r.RecursionDesired {
					t.Errorf("%v: header id=%#x qr=%v ra=%v rd=%v, want id=%#x qr=true ra=false rd=true",
						via, r.Id, r.Response, r.RecursionAvailable, r.RecursionDesired, tc.q.Id)
				}
				if r.Rcode != tc.rcode || r.Authoritative != tc.aa {
					t.Errorf("%v: rcode %s aa=%v, want %s aa=%v", via,
						dns.RcodeToString[r.Rcode], r.Authoritative, dns.RcodeToString[tc.rcode], tc.aa)
				}
				if diff := cmp.Diff(tc.answer, rrStrings(r.Answer), serial(r)); diff != "" {
					t.Errorf("%v: answer (-want +got):\n%s", via, diff)
				}
				if diff := cmp.Diff(tc.ns, rrStrings(r.Ns), serial(r)); diff != "" {
					t.Errorf("%v: authority (-want +got):\n%s", via, diff)
				}
			}
		})
	}
}

// serial is a cmp option that replaces the SOA serial in wanted records
// with the one actually sent.
func serial(r *dns.Msg) cmp.Option {
	var got string
	for _, rr := range slices.Concat(r.Answer, r.Ns) {
		if soa, ok := rr.(*dns.SOA); ok {
			got = strings.Fields(soa.String())[6]
		}
	}
	return cmp.Transformer("serial", func(s string) string { return strings.Replace(s, "SERIAL", got, 1) })
}

func TestEDNS0(t *testing.T) {
	s := newTestServer(t, Options{})

	r, _ := exchange(t, s, query("edge-1.", dns.TypeA, 4096), overUDP)
	opt := r.IsEdns0()
	if opt == nil {
		t.Fatal("no OPT in the answer to an EDNS0 query")
	}
	if opt.UDPSize() != DefaultMaxUDPSize || opt.Version() != 0 || opt.Do() {
		t.Errorf("OPT size %d version %d do %v, want %d 0 false", opt.UDPSize(), opt.Version(), opt.Do(), DefaultMaxUDPSize)
	}

	q := query("edge-1.", dns.TypeA, 1232)
	q.IsEdns0().SetDo()
	if r, _ := exchange(t, s, q, overUDP); !r.IsEdns0().Do() {
		t.Error("DO bit not copied into the answer's OPT")
	}

	if r, _ := exchange(t, s, query("edge-1.", dns.TypeA, 0), overUDP); r.IsEdns0() != nil {
		t.Error("OPT in the answer to a query without EDNS0")
	}

	q = query("edge-1.", dns.TypeA, 1232)
	q.IsEdns0().SetVersion(1)
	r, _ = exchange(t, s, q, overUDP)
	if r.Rcode != dns.RcodeBadVers || r.IsEdns0() == nil || len(r.Answer) != 0 {
		t.Errorf("EDNS version 1: rcode %s opt %v answers %d, want BADVERS with OPT and no answer",
			dns.RcodeToString[r.Rcode], r.IsEdns0(), len(r.Answer))
	}

	q = query("edge-1.", dns.TypeA, 1232)
	q.Extra = append(q.Extra, q.Extra[0])
	if r, _ := exchange(t, s, q, overUDP); r.Rcode != dns.RcodeFormatError {
		t.Errorf("two OPT records: rcode %s, want FORMERR", dns.RcodeToString[r.Rcode])
	}
}

// TestTruncation: UDP answers fit the size the client offers (the
// amplification bound is lifted here; TestAmplificationBound tests it).
func TestTruncation(t *testing.T) {
	s := newTestServer(t, Options{MaxAmplification: 1000})
	tests := []struct {
		name    string
		bufsize uint16
		via     transport
		limit   int
		trunc   bool
	}{
		{name: "no EDNS0: 512 bytes", limit: 512, trunc: true},
		{name: "EDNS0 512", bufsize: 512, limit: 512, trunc: true},
		{name: "EDNS0 size below 512 counts as 512", bufsize: 100, limit: 512, trunc: true},
		{name: "EDNS0 1232 holds 60 A records compressed", bufsize: 1232, limit: 1232},
		{name: "EDNS0 4096 capped at the server's 1232", bufsize: 4096, limit: 1232},
		{name: "TCP: everything", via: overTCP, limit: dns.MaxMsgSize},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, n := exchange(t, s, query("many.tether.internal.", dns.TypeA, tc.bufsize), tc.via)
			if n > tc.limit {
				t.Errorf("answer is %d bytes, limit %d", n, tc.limit)
			}
			if r.Truncated != tc.trunc {
				t.Errorf("TC=%v, want %v", r.Truncated, tc.trunc)
			}
			want := 60
			if tc.trunc {
				want = 0
			}
			if len(r.Answer) != want || r.Rcode != dns.RcodeSuccess {
				t.Errorf("%d answers rcode %s, want %d NOERROR", len(r.Answer), dns.RcodeToString[r.Rcode], want)
			}
			if (tc.bufsize != 0) != (r.IsEdns0() != nil) {
				t.Errorf("OPT in answer %v, in query %v", r.IsEdns0() != nil, tc.bufsize != 0)
			}
		})
	}
	// A small answer is never compressed or truncated.
	r, n := exchange(t, s, query("edge-1.tether.internal.", dns.TypeA, 0), overUDP)
	// header, name twice (24 bytes on the wire), qtype+qclass, RR header rest, IPv4
	if r.Truncated || n != 12+2*24+4+10+4 {
		t.Errorf("small answer: TC=%v, %d bytes", r.Truncated, n)
	}
}

// TestUpdate checks that a new snapshot is answered at once, and that the
// old table is left alone.
func TestUpdate(t *testing.T) {
	s := newTestServer(t, Options{})
	snap := testSnapshot()
	delete(snap.Nodes, "edge-1")
	snap.Nodes["edge-3"] = nodewatch.Node{Name: "edge-3", Edge: true, InternalIPs: addrs("10.0.0.33")}
	snap.Version++
	s.Update(snap)
	if r, _ := exchange(t, s, query("edge-1.tether.internal.", dns.TypeA, 0), overUDP); r.Rcode != dns.RcodeNameError {
		t.Errorf("deleted node: rcode %s, want NXDOMAIN", dns.RcodeToString[r.Rcode])
	}
	if r, _ := exchange(t, s, query("edge-1.", dns.TypeA, 0), overUDP); r.Rcode != dns.RcodeRefused {
		t.Errorf("deleted node, bare name: rcode %s, want REFUSED", dns.RcodeToString[r.Rcode])
	}
	r, _ := exchange(t, s, query("edge-3.tether.internal.", dns.TypeA, 0), overUDP)
	if diff := cmp.Diff([]string{"edge-3.tether.internal.\t5\tIN\tA\t10.0.0.33"}, rrStrings(r.Answer)); diff != "" {
		t.Errorf("added node (-want +got):\n%s", diff)
	}
}

// TestServeDNS checks that the dns.Handler path sends what the raw path
// sends.
func TestServeDNS(t *testing.T) {
	s := newTestServer(t, Options{})
	for _, q := range []*dns.Msg{
		query("edge-1.tether.internal.", dns.TypeA, 0),
		query("many.tether.internal.", dns.TypeA, 0),
		query("many.tether.internal.", dns.TypeA, 1232),
		query("nope.tether.internal.", dns.TypeA, 1232),
	} {
		for _, via := range []transport{overUDP, overTCP} {
			w := &recorder{via: via}
			s.ServeDNS(w, q)
			b, _ := q.Pack()
			want := s.handle(newSession(), b, via, testSource)
			if via == overTCP {
				want = want[2:]
			}
			if !slices.Equal(w.out, want) {
				t.Errorf("%v %v: ServeDNS wrote %d bytes, raw path %d bytes, or they differ", q.Question[0], via, len(w.out), len(want))
			}
		}
	}
}

// TestAmplificationBound: over UDP no answer is more than
// MaxAmplification times its query; past it the answer is truncated to at
// most the query's size and the client asks again over TCP, which gets
// everything. Everyday answers stay within the bound untruncated.
func TestAmplificationBound(t *testing.T) {
	nodes := testSnapshot()
	var four []netip.Addr
	for i := range 4 {
		four = append(four, netip.AddrFrom4([4]byte{10, 8, 0, byte(1 + i)}))
	}
	nodes.Nodes["e"] = nodewatch.Node{Name: "e", Edge: true, InternalIPs: four}
	s := newTestServer(t, Options{})
	s.Update(nodes)
	for _, tc := range []struct {
		name    string
		q       *dns.Msg
		answers int
		trunc   bool
	}{
		{"one address", query("edge-2.tether.internal.", dns.TypeA, 1232), 1, false},
		{"one address, no EDNS0", query("edge-2.", dns.TypeA, 0), 1, false},
		{"four addresses under the zone", query("e.tether.internal.", dns.TypeA, 1232), 4, false},
		{"four addresses, shortest bare name", query("e.", dns.TypeA, 0), 0, true},
		{"NXDOMAIN with the SOA", query("x.tether.internal.", dns.TypeA, 0), 0, false},
		{"SOA", query("tether.internal.", dns.TypeSOA, 0), 1, false},
		{"60 addresses", query("many.tether.internal.", dns.TypeA, 1232), 0, true},
		{"60 addresses, ANY", query("many.tether.internal.", dns.TypeANY, 4096), 0, true},
	} {
		b, err := tc.q.Pack()
		if err != nil {
			t.Fatal(err)
		}
		r, n := exchange(t, s, tc.q, overUDP)
		t.Logf("%s: query %d bytes, answer %d bytes (%.1fx), %d records, TC=%v", tc.name, len(b), n, float64(n)/float64(len(b)), len(r.Answer), r.Truncated)
		if n > DefaultMaxAmplification*len(b) {
			t.Errorf("%s: %d-byte answer to a %d-byte query: more than %dx", tc.name, n, len(b), DefaultMaxAmplification)
		}
		if r.Truncated != tc.trunc || len(r.Answer) != tc.answers {
			t.Errorf("%s: TC=%v with %d answers, want TC=%v with %d", tc.name, r.Truncated, len(r.Answer), tc.trunc, tc.answers)
		}
		if tc.trunc && n > len(b) {
			t.Errorf("%s: truncated answer %d bytes, query %d", tc.name, n, len(b))
		}
		if tc.trunc {
			if r, _ := exchange(t, s, tc.q, overTCP); r.Truncated || len(r.Answer) == 0 {
				t.Errorf("%s over TCP: TC=%v with %d answers", tc.name, r.Truncated, len(r.Answer))
			}
		}
	}
}
