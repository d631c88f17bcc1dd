package dns

import (
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/accept"
)

// The names of the server's sockets in tether_gateway_accept_errors_total.
const (
	listenerTCP = "dns_tcp"
	listenerUDP = "dns_udp"
)

// metrics counts queries by response code, TCP connections, and failed
// accepts and reads. A nil *metrics counts nothing.
type metrics struct {
	byRcode [dns.RcodeBadCookie + 1]prometheus.Counter
	other   prometheus.Counter
	none    prometheus.Counter // queries that got no answer

	tcpOpen                prometheus.Gauge
	refusedMax, refusedSrc prometheus.Counter
	acceptTCP, acceptUDP   prometheus.Counter
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

	m.tcpOpen = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: "tether",
		Subsystem: "gateway_dns",
		Name:      "tcp_connections",
		Help:      "Open DNS TCP connections.",
	})
	refusals := prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "tether",
		Subsystem: "gateway_dns",
		Name:      "tcp_refusals_total",
		Help:      "DNS TCP connections reset at once, by reason: max_connections (the server's cap) or max_connections_per_source (the cap per client address).",
	}, []string{"reason"})
	reg.MustRegister(m.tcpOpen, refusals)
	m.refusedMax = refusals.WithLabelValues(ReasonMaxConns)
	m.refusedSrc = refusals.WithLabelValues(ReasonMaxConnsPerSource)
	var err error
	if m.acceptTCP, err = accept.Counter(reg, "tether_gateway", listenerTCP); err != nil {
		panic(err) // as MustRegister does
	}
	if m.acceptUDP, err = accept.Counter(reg, "tether_gateway", listenerUDP); err != nil {
		panic(err)
	}
	return m
}

// acceptErrors is the series of tether_gateway_accept_errors_total for
// listener; nil counts nothing.
func (m *metrics) acceptErrors(listener string) prometheus.Counter {
	switch {
	case m == nil:
		return nil
	case listener == listenerTCP:
		return m.acceptTCP
	}
	return m.acceptUDP
}

func (m *metrics) tcpOpened() {
	if m != nil {
		m.tcpOpen.Inc()
	}
}

func (m *metrics) tcpClosed() {
	if m != nil {
		m.tcpOpen.Dec()
	}
}

func (m *metrics) tcpRefused(reason string) {
	switch {
	case m == nil:
	case reason == ReasonMaxConns:
		m.refusedMax.Inc()
	default:
		m.refusedSrc.Inc()
	}
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
