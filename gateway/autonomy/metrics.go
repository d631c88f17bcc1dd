package autonomy

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
)

// metrics count the controller's pod patches; autonomous reads the edge
// Nodes that ask for autonomy when scraped.
type metrics struct {
	patches    *prometheus.CounterVec
	autonomous prometheus.GaugeFunc
}

func newMetrics(reg prometheus.Registerer, autonomous func() float64) (*metrics, error) {
	m := &metrics{
		patches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_autonomy_pod_patches_total",
			Help: "Patches of the unreachable and not-ready tolerations of autonomous edge nodes' pods, by action and result.",
		}, []string{"action", "result"}),
		autonomous: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tether_gateway_autonomy_nodes",
			Help: "Edge Nodes whose annotations ask for autonomy, as the Node informer sees them.",
		}, autonomous),
	}
	for _, a := range []string{actionHold, actionRestore} {
		for _, r := range []string{"ok", "error"} {
			m.patches.WithLabelValues(a, r)
		}
	}
	return m, promreg.Register(reg, m.patches, m.autonomous)
}
