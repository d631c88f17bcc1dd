package edgetunnel

import (
	"maps"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
	"github.com/tether-edge/tether/tunnel"
)

// metrics: stream results are counters of their own; the per-gateway
// series are read from the replicas when scraped (collector), so that a
// replica's series go away with it.
type metrics struct {
	byCode     map[tunnel.Code]prometheus.Counter
	other      *prometheus.CounterVec
	heartbeats *prometheus.CounterVec
	elections  *prometheus.CounterVec
}

// newMetrics builds the metrics of c and registers them with reg; a nil
// reg gives a nil *metrics (nothing counted).
func newMetrics(reg prometheus.Registerer, c *Client) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	streams := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_tunnel_streams_total",
		Help: "Streams the gateways opened, by result: ok or the reason code of the refusal.",
	}, []string{"result"})
	heartbeats := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_tunnel_delegated_heartbeats_total",
		Help: "Delegated heartbeats sent to a gateway replica, one per attempt, by result: ok, the refusal's code or error.",
	}, []string{"result"})
	elections := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_edge_tunnel_election_writes_total",
		Help: "Pool election and sync records sent to a gateway replica to write, one per attempt, by result.",
	}, []string{"result"})
	if err := promreg.Register(reg, streams, heartbeats, elections, &collector{c: c}); err != nil {
		return nil, err
	}
	m := &metrics{byCode: make(map[tunnel.Code]prometheus.Counter), other: streams, heartbeats: heartbeats, elections: elections}
	for _, code := range tunnel.Codes() {
		m.byCode[code] = streams.WithLabelValues(code.String())
	}
	for _, code := range tunnel.DelegateCodes() {
		heartbeats.WithLabelValues(code.String())
	}
	heartbeats.WithLabelValues(resultError)
	for _, code := range tunnel.ElectionCodes() {
		elections.WithLabelValues(code.String())
	}
	elections.WithLabelValues(resultError)
	return m, nil
}

// resultError is the result of a heartbeat or election attempt whose
// stream failed.
const resultError = "error"

// heartbeat counts the result of one DelegateHeartbeat attempt.
func (m *metrics) heartbeat(err error) {
	if m == nil {
		return
	}
	m.heartbeats.WithLabelValues(attemptResult(err)).Inc()
}

// election counts the result of one WriteElectionRecord attempt.
func (m *metrics) election(err error) {
	if m == nil {
		return
	}
	m.elections.WithLabelValues(attemptResult(err)).Inc()
}

// attemptResult is the metric label of an attempt's result: ok, the
// refusal's code, or error.
func attemptResult(err error) string {
	if err == nil {
		return tunnel.OK.String()
	}
	if code, ok := refusalCode(err); ok {
		return code.String()
	}
	return resultError
}

func (m *metrics) result(code tunnel.Code) {
	if m == nil {
		return
	}
	if ctr, ok := m.byCode[code]; ok {
		ctr.Inc()
		return
	}
	m.other.WithLabelValues(code.String()).Inc()
}

var (
	descConnected = prometheus.NewDesc("tether_edge_tunnel_gateway_connected",
		"Whether the QUIC connection to this gateway replica is up: one while it is, zero while the edge reconnects.",
		[]string{"gateway"}, nil)
	descRTT = prometheus.NewDesc("tether_edge_tunnel_gateway_rtt_seconds",
		"Smoothed round-trip time of the connection to this gateway replica (only while connected).",
		[]string{"gateway"}, nil)
	descReconnects = prometheus.NewDesc("tether_edge_tunnel_gateway_reconnects_total",
		"Connection attempts to this gateway replica after the first (after a failed dial or a lost connection).",
		[]string{"gateway"}, nil)
	descStreamsOpen = prometheus.NewDesc("tether_edge_tunnel_gateway_streams_open",
		"Streams from this gateway replica being served now.",
		[]string{"gateway"}, nil)
	descDisconnects = prometheus.NewDesc("tether_edge_tunnel_gateway_disconnects_total",
		"Connections to this gateway replica that were up and ended, by reason.",
		[]string{"gateway", "reason"}, nil)
	descProbes = prometheus.NewDesc("tether_edge_tunnel_gateway_probes_total",
		"Liveness probes sent to this gateway replica, each after a keepalive period without a packet from it.",
		[]string{"gateway"}, nil)
	descBytes = prometheus.NewDesc("tether_edge_tunnel_gateway_bytes_total",
		"Bytes relayed through this gateway replica; direction up is edge to cloud, down is cloud to edge.",
		[]string{"gateway", "direction"}, nil)
)

type collector struct{ c *Client }

func (col *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConnected, descRTT, descReconnects, descStreamsOpen, descBytes, descDisconnects, descProbes} {
		ch <- d
	}
}

func (col *collector) Collect(ch chan<- prometheus.Metric) {
	col.c.mu.Lock()
	rs := slices.Collect(maps.Values(col.c.replicas))
	col.c.mu.Unlock()
	for _, r := range rs {
		gw := r.ep.addr.String()
		for end := range numEnds {
			ch <- prometheus.MustNewConstMetric(descDisconnects, prometheus.CounterValue, float64(r.ends[end].Load()), gw, endNames[end])
		}
		ch <- prometheus.MustNewConstMetric(descProbes, prometheus.CounterValue, float64(r.probes.Load()), gw)
	}
	for _, s := range col.c.Status() {
		gw := s.Gateway
		connected := 0.0
		if s.Connected {
			connected = 1
			ch <- prometheus.MustNewConstMetric(descRTT, prometheus.GaugeValue, s.RTTSeconds, gw)
		}
		ch <- prometheus.MustNewConstMetric(descConnected, prometheus.GaugeValue, connected, gw)
		ch <- prometheus.MustNewConstMetric(descReconnects, prometheus.CounterValue, float64(s.Reconnects), gw)
		ch <- prometheus.MustNewConstMetric(descStreamsOpen, prometheus.GaugeValue, float64(s.StreamsOpen), gw)
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(s.BytesUp), gw, "up")
		ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(s.BytesDown), gw, "down")
	}
}
