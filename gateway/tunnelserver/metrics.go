package tunnelserver

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
	"github.com/tether-edge/tether/tunnel"
)

// metrics count the server's connections, handshakes and edge streams;
// the gauges of the handshake gate, the receive budget and the UDP socket
// are read from them when scraped.
type metrics struct {
	conns       *prometheus.CounterVec
	evictions   *prometheus.CounterVec
	edgeStreams *prometheus.CounterVec
	shed        prometheus.Counter
	retries     prometheus.Counter
	abandoned   prometheus.Counter
}

// newMetrics builds s's metrics and registers them with reg: with the
// handshake gate's when s has one, and the receive budget's when budget
// is not nil.
func newMetrics(reg prometheus.Registerer, s *Server, budget *tunnel.ReceiveBudget) (*metrics, error) {
	m := &metrics{
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_tunnel_connections_total",
			Help: "Tunnel connections by result: registered, or the reason the gateway refused them.",
		}, []string{"result"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_tunnel_evictions_total",
			Help: "Live tunnels closed because their client certificate no longer verifies against the client CAs, or was retired.",
		}, []string{"reason"}),
		edgeStreams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_tunnel_edge_streams_total",
			Help: "Streams edges opened toward the gateway (heartbeats, election writes, liveness probes), by result.",
		}, []string{"result"}),
		shed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_gateway_tunnel_handshakes_shed_total",
			Help: "Tunnel handshakes refused because no --max-handshakes place freed in time.",
		}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_gateway_tunnel_retries_total",
			Help: "New tunnel handshakes asked to prove their source address with a QUIC Retry first.",
		}),
		abandoned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_gateway_tunnel_handshakes_abandoned_total",
			Help: "Tunnel handshakes whose connection ended while they held a --max-handshakes place, before a certificate came.",
		}),
	}
	for _, r := range results {
		m.conns.WithLabelValues(r)
	}
	for _, r := range []string{resultExpired, resultUnknownCA, resultBadCertificate, resultRetired} {
		m.evictions.WithLabelValues(r)
	}
	for _, r := range []string{streamServed, streamProbe, streamBadRequest, streamAborted} {
		m.edgeStreams.WithLabelValues(r)
	}

	cs := []prometheus.Collector{m.conns, m.evictions, m.edgeStreams, m.shed,
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "tether_gateway_tunnel_udp_drops_total",
			Help: "Datagrams the kernel dropped on the tunnel listener's UDP socket because its receive buffer was full.",
		}, s.droppedDatagrams),
	}
	if s.gate != nil {
		cs = append(cs, m.retries, m.abandoned,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "tether_gateway_tunnel_handshakes_in_progress",
				Help: "Tunnel TLS handshakes in progress, from the edge's ClientHello until its certificate is checked.",
			}, func() float64 { in, _ := s.gate.counts(); return float64(in) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "tether_gateway_tunnel_handshakes_waiting",
				Help: "Tunnel handshakes waiting for a --max-handshakes place, the newest first.",
			}, func() float64 { _, w := s.gate.counts(); return float64(w) }))
	}
	if b := budget; b != nil {
		cs = append(cs,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "tether_gateway_tunnel_receive_window_growth_bytes",
				Help: "How far the live tunnels' QUIC receive windows have grown beyond their initial size, together.",
			}, func() float64 { return float64(b.Used()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "tether_gateway_tunnel_receive_window_growth_limit_bytes",
				Help: "The most the tunnels' receive windows may grow beyond their initial size together (--max-receive-memory).",
			}, func() float64 { return float64(b.Limit()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "tether_gateway_tunnel_receive_window_refusals_total",
				Help: "Receive window increases refused because --max-receive-memory was spent; the tunnel kept its window.",
			}, func() float64 { return float64(b.Refused()) }))
	}
	return m, promreg.Register(reg, cs...)
}
