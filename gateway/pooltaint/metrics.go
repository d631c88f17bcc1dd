package pooltaint

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
)

// metrics count the controller's taint changes; tainted reads the Nodes
// that carry the taint when scraped.
type metrics struct {
	changes *prometheus.CounterVec
	tainted prometheus.GaugeFunc
}

func newMetrics(reg prometheus.Registerer, tainted func() float64) (*metrics, error) {
	m := &metrics{
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_delegated_heartbeat_taint_changes_total",
			Help: "Changes of the unschedulable taint on Nodes whose heartbeats are delegated, by action and result.",
		}, []string{"action", "result"}),
		tainted: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tether_gateway_delegated_heartbeat_tainted_nodes",
			Help: "Nodes that carry the unschedulable taint of delegated heartbeats, as the Node informer sees them.",
		}, tainted),
	}
	for _, a := range []string{actionTaint, actionUntaint} {
		for _, r := range []string{"ok", "error"} {
			m.changes.WithLabelValues(a, r)
		}
	}
	return m, promreg.Register(reg, m.changes, m.tainted)
}
