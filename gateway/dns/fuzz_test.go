package dns

import (
	"testing"

	"github.com/miekg/dns"

	"github.com/tether-edge/tether/gateway/nodewatch"
)

// FuzzServeDNS feeds raw messages to the query path. A message that does
// not unpack gets no answer; one that does gets a well-formed answer with
// its ID that fits the UDP limit; nothing panics. The dns.Handler path
// must agree with the raw one.
func FuzzServeDNS(f *testing.F) {
	s := newTestServer(f, Options{Mode: nodewatch.ModeVIP, CloudNodes: true})
	for _, q := range []*dns.Msg{
		query("edge-1.", dns.TypeA, 0),
		query("edge-1.tether.internal.", dns.TypeAAAA, 1232),
		query("many.tether.internal.", dns.TypeA, 512),
		query("1.0.64.100.in-addr.arpa.", dns.TypePTR, 0),
		query("tether.internal.", dns.TypeSOA, 4096),
		query("nope.tether.internal.", dns.TypeANY, 0),
		query("example.com.", dns.TypeA, 0),
	} {
		b, err := q.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x12, 0x34, 0x01, 0x00, 0x00, 0x01})
	ss := newSession() // reused across inputs, as a serving goroutine does

	f.Fuzz(func(t *testing.T, in []byte) {
		var m dns.Msg
		unpackErr := m.Unpack(in)
		for _, via := range []transport{overUDP, overTCP} {
			out := s.handle(ss, in, via, testSource)
			if unpackErr != nil || m.Response {
				if out != nil {
					t.Fatalf("%v: answered a message that must get no answer (unpack: %v)", via, unpackErr)
				}
				continue
			}
			if out == nil {
				t.Fatalf("%v: no answer to a query that unpacks:\n%v", via, &m)
			}
			if via == overTCP {
				out = out[2:]
			}
			var r dns.Msg
			if err := r.Unpack(out); err != nil {
				t.Fatalf("%v: answer does not unpack: %v", via, err)
			}
			if r.Id != m.Id || !r.Response || r.RecursionAvailable {
				t.Fatalf("%v: bad answer header: %v", via, &r.MsgHdr)
			}
			if limit := udpLimit(&m); via == overUDP && len(out) > limit {
				t.Fatalf("UDP answer of %d bytes, limit %d", len(out), limit)
			}
			w := &recorder{via: via}
			s.ServeDNS(w, &m)
			if string(w.out) != string(out) {
				t.Fatalf("%v: ServeDNS and the raw path differ", via)
			}
		}
	})
}

func udpLimit(m *dns.Msg) int {
	if o := m.IsEdns0(); o != nil && o.UDPSize() > 512 {
		return min(int(o.UDPSize()), DefaultMaxUDPSize)
	}
	return 512
}
