package proxy

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/gateway/registry"
	"github.com/tether-edge/tether/internal/accept"
	"github.com/tether-edge/tether/internal/promreg"
	"github.com/tether-edge/tether/tunnel"
)

// Connection results.
const (
	resultRelayed    = "relayed"     // relayed until both sides finished
	resultRelayError = "relay_error" // relayed, then one side failed or idled out
	resultRefused    = "refused"     // never relayed; see the refusals by reason
)

// Bytes relayed are counted per edge by the registry
// (tether_gateway_edge_bytes_total, tether_gateway_tunnel_bytes_total),
// which owns the counters the relays feed.
type metrics struct {
	connections *prometheus.CounterVec
	refusals    *prometheus.CounterVec
	active      prometheus.Gauge
	// acceptErrors is the listener's series of
	// tether_gateway_accept_errors_total; nil without a registerer.
	acceptErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		connections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_proxy_connections_total",
			Help: "Client connections the transparent listener finished, by result: relayed, relay_error or refused.",
		}, []string{"result"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_proxy_refusals_total",
			Help: "Client connections reset without relaying, by reason: the gateway's or the edge's reply code.",
		}, []string{"reason"}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tether_gateway_proxy_active_connections",
			Help: "Client connections being routed or relayed.",
		}),
	}
	for _, r := range []string{resultRelayed, resultRelayError, resultRefused} {
		m.connections.WithLabelValues(r)
	}
	reasons := []string{ReasonSource, ReasonNoRoute, ReasonPeekTimeout, ReasonReplyTimeout, ReasonStreamError,
		registry.ReasonNoTunnel, registry.ReasonOverloaded, registry.ReasonOpenFailed}
	for _, c := range tunnel.Codes() {
		if c != tunnel.OK {
			reasons = append(reasons, c.String())
		}
	}
	for _, r := range reasons {
		m.refusals.WithLabelValues(r)
	}
	if err := promreg.Register(reg, m.connections, m.refusals, m.active); err != nil {
		return nil, fmt.Errorf("register proxy metrics: %w", err)
	}
	var err error
	if m.acceptErrors, err = accept.Counter(reg, "tether_gateway_accept_errors_total", "proxy"); err != nil {
		return nil, err
	}
	return m, nil
}
