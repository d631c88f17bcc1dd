package nodewatch

import "github.com/prometheus/client_golang/prometheus"

// metrics count the address claims and pod ranges the Watcher refuses. Its Describe and
// Collect make the Watcher, which embeds it, the prometheus.Collector its
// owner registers.
type metrics struct {
	refusalsNow   *prometheus.GaugeVec
	refusalsTotal *prometheus.CounterVec

	podRefusalsNow   *prometheus.GaugeVec
	podRefusalsTotal *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		refusalsNow: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tether_gateway_address_refusals",
			Help: "Addresses edge nodes claim that the gateway does not route to them now, by reason.",
		}, []string{"reason"}),
		refusalsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_address_refusals_total",
			Help: "Address claims of edge nodes the gateway refused to route, each counted once when it appears, by reason.",
		}, []string{"reason"}),
		podRefusalsNow: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tether_gateway_pod_range_refusals",
			Help: "Pod ranges of edge nodes that the gateway does not route to them now, by reason.",
		}, []string{"reason"}),
		podRefusalsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_pod_range_refusals_total",
			Help: "Pod ranges of edge nodes the gateway refused to route, each counted once when it appears, by reason.",
		}, []string{"reason"}),
	}
	for _, r := range PodReasons() {
		m.podRefusalsNow.WithLabelValues(string(r))
		m.podRefusalsTotal.WithLabelValues(string(r))
	}
	for _, r := range Reasons() {
		m.refusalsNow.WithLabelValues(string(r))
		m.refusalsTotal.WithLabelValues(string(r))
	}
	return m
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.refusalsNow.Describe(ch)
	m.refusalsTotal.Describe(ch)
	m.podRefusalsNow.Describe(ch)
	m.podRefusalsTotal.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.refusalsNow.Collect(ch)
	m.refusalsTotal.Collect(ch)
	m.podRefusalsNow.Collect(ch)
	m.podRefusalsTotal.Collect(ch)
}

var _ prometheus.Collector = (*Watcher)(nil)
