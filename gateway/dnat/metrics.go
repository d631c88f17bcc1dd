package dnat

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
)

// metrics count the reconciler's applies of the rules.
type metrics struct {
	applies  *prometheus.CounterVec
	duration prometheus.Histogram
	edges    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		applies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_netrules_applies_total",
			Help: "Applications of the DNAT rules by result (ok, error).",
		}, []string{"result"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "tether_gateway_netrules_apply_seconds",
			Help:    "Time to apply the DNAT rules.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8),
		}),
		edges: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tether_gateway_netrules_edges",
			Help: "Edge nodes with DNAT rules in place.",
		}),
	}
	return m, promreg.Register(reg, m.applies, m.duration, m.edges)
}
