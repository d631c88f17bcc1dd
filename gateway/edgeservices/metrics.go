package edgeservices

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
	"github.com/tether-edge/tether/tunnel"
)

type metrics struct {
	streams  *prometheus.CounterVec
	refusals *prometheus.CounterVec
	open     prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_edge_service_streams_total",
			Help: "Edge pods' connections to cloud Services that this replica answered, by the reply's code.",
		}, []string{"result"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_edge_service_refusals_total",
			Help: "Edge pods' connections to cloud Services this replica refused, by reason.",
		}, []string{"reason"}),
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tether_gateway_edge_service_connections",
			Help: "Edge pods' connections to cloud Services open through this replica now.",
		}),
	}
	for _, c := range tunnel.ServiceCodes() {
		m.streams.WithLabelValues(c.String())
	}
	for _, r := range []string{ReasonNotMarked, ReasonNoEndpoints, ReasonEndpointRefused, ReasonRate, ReasonBusy} {
		m.refusals.WithLabelValues(r)
	}
	if err := promreg.Register(reg, m.streams, m.refusals, m.open); err != nil {
		return nil, err
	}
	return m, nil
}
