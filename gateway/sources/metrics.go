package sources

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
)

type metrics struct {
	refusals *prometheus.CounterVec
}

// Listeners whose series exist from the start.
var listeners = []string{"proxy", "admin"}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_source_refusals_total",
			Help: "Connections reset because the client is not an allowed source or is an edge's, by listener and reason.",
		}, []string{"listener", "reason"}),
	}
	for _, l := range listeners {
		for _, r := range Reasons {
			m.refusals.WithLabelValues(l, r)
		}
	}
	if err := promreg.Register(reg, m.refusals); err != nil {
		return nil, fmt.Errorf("register source filter metrics: %w", err)
	}
	return m, nil
}
