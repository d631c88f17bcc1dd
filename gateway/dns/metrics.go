package dns

import (
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/accept"
	"github.com/tether-edge/tether/internal/promreg"
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

// newMetrics builds the metrics and registers them with reg; a nil reg
// gives a nil *metrics.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	queries := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_gateway_dns_queries_total",
		Help: "DNS queries by response code; rcode=none counts messages that got no answer.",
	}, []string{"rcode"})
	refusals := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_gateway_dns_tcp_refusals_total",
		Help: "DNS TCP connections reset at once, by reason: the server's cap or the cap per client address.",
	}, []string{"reason"})
	m := &metrics{
		other: queries.WithLabelValues("other"),
		none:  queries.WithLabelValues("none"),
		tcpOpen: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tether_gateway_dns_tcp_connections",
			Help: "Open DNS TCP connections.",
		}),
		refusedMax: refusals.WithLabelValues(ReasonMaxConns),
		refusedSrc: refusals.WithLabelValues(ReasonMaxConnsPerSource),
	}
	for _, rc := range []int{dns.RcodeSuccess, dns.RcodeFormatError, dns.RcodeServerFailure,
		dns.RcodeNameError, dns.RcodeNotImplemented, dns.RcodeRefused, dns.RcodeBadVers} {
		m.byRcode[rc] = queries.WithLabelValues(dns.RcodeToString[rc])
	}
	if err := promreg.Register(reg, queries, m.tcpOpen, refusals); err != nil {
		return nil, err
	}
	var err error
	if m.acceptTCP, err = accept.Counter(reg, "tether_gateway_accept_errors_total", listenerTCP); err != nil {
		return nil, err
	}
	if m.acceptUDP, err = accept.Counter(reg, "tether_gateway_accept_errors_total", listenerUDP); err != nil {
		return nil, err
	}
	return m, nil
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
