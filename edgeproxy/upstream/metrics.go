package upstream

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
)

// metrics are the health of each server and its probes' results. A nil
// *metrics counts nothing.
type metrics struct {
	healthy *prometheus.GaugeVec
	probes  *prometheus.CounterVec
}

// newMetrics builds the metrics of servers (their names) and registers
// them with reg; a nil reg gives a nil *metrics.
func newMetrics(reg prometheus.Registerer, servers []string) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tether_edge_apiserver_upstream_healthy",
			Help: "Whether this cloud kube-apiserver passes its health checks, after the hysteresis: one if it does, else zero.",
		}, []string{"server"}),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_apiserver_upstream_probes_total",
			Help: "Health probes of this cloud kube-apiserver, by result (ok or fail).",
		}, []string{"server", "result"}),
	}
	if err := promreg.Register(reg, m.healthy, m.probes); err != nil {
		return nil, err
	}
	for _, s := range servers {
		m.healthy.WithLabelValues(s).Set(0)
	}
	return m, nil
}

func (m *metrics) probed(server, result string) {
	if m != nil {
		m.probes.WithLabelValues(server, result).Inc()
	}
}

func (m *metrics) setHealthy(server string, healthy bool) {
	if m == nil {
		return
	}
	v := 0.0
	if healthy {
		v = 1
	}
	m.healthy.WithLabelValues(server).Set(v)
}
