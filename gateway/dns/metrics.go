package dns

import (
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics counts queries by response code. A nil *metrics counts nothing.
type metrics struct {
	byRcode [dns.RcodeBadCookie + 1]prometheus.Counter
	other   prometheus.Counter
	none    prometheus.Counter // queries that got no answer
}

func newMetrics(reg prometheus.Registerer) *metrics {
	if reg == nil {
		return nil
	}
	v := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "tether",
		Subsystem: "gateway_dns",
		Name:      "queries_total",
		Help:      "DNS queries by response code; rcode=none counts messages that got no answer.",
	}, []string{"rcode"})
	reg.MustRegister(v)
	m := &metrics{other: v.WithLabelValues("other"), none: v.WithLabelValues("none")}
	for _, rc := range []int{dns.RcodeSuccess, dns.RcodeFormatError, dns.RcodeServerFailure,
		dns.RcodeNameError, dns.RcodeNotImplemented, dns.RcodeRefused, dns.RcodeBadVers} {
		m.byRcode[rc] = v.WithLabelValues(dns.RcodeToString[rc])
	}
	return m
}

func (m *metrics) answered(rcode int) {
	if m == nil {
		return
	}
	if rcode >= 0 && rcode < len(m.byRcode) && m.byRcode[rcode] != nil {
		m.byRcode[rcode].Inc()
		return
	}
	m.other.Inc()
}

func (m *metrics) dropped() {
	if m != nil {
		m.none.Inc()
	}
}
