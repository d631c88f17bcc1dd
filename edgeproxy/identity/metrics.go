package identity

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
)

// metrics are those of the certificate obtained through the CSR API.
type metrics struct {
	renewFailures prometheus.Counter
	expiry        prometheus.GaugeFunc
}

// newMetrics registers the metrics with reg; expiry is the current
// certificate's end (Unix time), 0 before the first.
func newMetrics(reg prometheus.Registerer, expiry func() float64) (*metrics, error) {
	m := &metrics{
		renewFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_edge_client_certificate_renew_failures_total",
			Help: "Failed attempts to obtain the node's client certificate through the CSR API.",
		}),
		expiry: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tether_edge_client_certificate_expiry_timestamp_seconds",
			Help: "When the node's client certificate from the CSR API expires, in Unix time; zero before the first.",
		}, expiry),
	}
	if err := promreg.Register(reg, m.renewFailures, m.expiry); err != nil {
		return nil, err
	}
	return m, nil
}
