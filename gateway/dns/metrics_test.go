package dns

import (
	"testing"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := newTestServer(t, Options{Registerer: reg})
	exchange(t, s, query("edge-1.", dns.TypeA, 0), overUDP)
	exchange(t, s, query("edge-1.", dns.TypeA, 0), overTCP)
	exchange(t, s, query("nope.tether.internal.", dns.TypeA, 0), overUDP)
	exchange(t, s, query("example.com.", dns.TypeA, 0), overUDP)
	s.handle(newSession(), []byte{1, 2, 3}, overUDP, testSource)

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "tether_gateway_dns_queries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if v := m.GetCounter().GetValue(); v != 0 {
				got[m.GetLabel()[0].GetValue()] = v
			}
		}
	}
	want := map[string]float64{"NOERROR": 2, "NXDOMAIN": 1, "REFUSED": 1, "none": 1}
	if len(got) != len(want) {
		t.Errorf("counters %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("counter %s = %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
}
