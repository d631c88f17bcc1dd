package election

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
	"github.com/tether-edge/tether/tunnel"
)

// metrics count the election record writes by result.
type metrics struct {
	results *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_election_writes_total",
			Help: "Pool election records written for edges, by result: ok or the refusal's code.",
		}, []string{"result"}),
	}
	for _, c := range tunnel.ElectionCodes() {
		m.results.WithLabelValues(c.String())
	}
	return m, promreg.Register(reg, m.results)
}

// result counts one request's result: OK or the refusal's code.
func (m *metrics) result(c tunnel.Code) { m.results.WithLabelValues(c.String()).Inc() }
