package edgeservice

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
	"github.com/tether-edge/tether/tunnel"
)

// Refusal reasons, as counted.
const (
	ReasonSource    = "source"     // the client is no pod of this node, nor the node itself
	ReasonNotMarked = "not_marked" // the original destination is no marked ClusterIP and port
)

// resultError is the result of a stream that could not be opened: no
// gateway connected, or every attempt failed.
const resultError = "error"

type metrics struct {
	refusals *prometheus.CounterVec
	streams  *prometheus.CounterVec
	rules    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_service_refusals_total",
			Help: "Connections to the service listener reset before any stream was opened, by reason.",
		}, []string{"reason"}),
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_service_streams_total",
			Help: "Connections of this node's pods to marked cloud Services, by the gateway's reply code, or error.",
		}, []string{"result"}),
		rules: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_service_rules_applies_total",
			Help: "Applies of the host rules that redirect pods' connections to marked Services, by result.",
		}, []string{"result"}),
	}
	if err := promreg.Register(reg, m.refusals, m.streams, m.rules); err != nil {
		return nil, err
	}
	for _, r := range []string{ReasonSource, ReasonNotMarked} {
		m.refusals.WithLabelValues(r)
	}
	for _, c := range tunnel.ServiceCodes() {
		m.streams.WithLabelValues(c.String())
	}
	m.streams.WithLabelValues(tunnel.Unavailable.String())
	m.streams.WithLabelValues(resultError)
	m.rules.WithLabelValues("ok")
	m.rules.WithLabelValues("error")
	return m, nil
}
