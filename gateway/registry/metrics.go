package registry

import (
	"github.com/prometheus/client_golang/prometheus"
)

// The registry's metrics are read from the live edges at scrape time, so
// that an edge that goes away leaves no stale series behind. Per-edge
// counters start from zero on every new connection of a node; the tunnel
// totals never go back.
var (
	descEdges = prometheus.NewDesc("tether_gateway_edges_connected",
		"Edges with a live tunnel to this gateway replica.", nil, nil)
	descRegistrations = prometheus.NewDesc("tether_gateway_edge_registrations_total",
		"Edge tunnel registrations; replaced closed an older one of the same node, refused came too often to replace it.",
		[]string{"result"}, nil)
	descStreams = prometheus.NewDesc("tether_gateway_tunnel_streams",
		"Streams open over all tunnels.", nil, nil)
	descBytes = prometheus.NewDesc("tether_gateway_tunnel_bytes_total",
		"Bytes relayed over all tunnels; direction up is toward the edges.",
		[]string{"direction"}, nil)
	descEdgeStreams = prometheus.NewDesc("tether_gateway_edge_streams",
		"Streams open to one edge.", []string{"node"}, nil)
	descEdgeRTT = prometheus.NewDesc("tether_gateway_edge_rtt_seconds",
		"Smoothed round-trip time of one edge's tunnel.", []string{"node"}, nil)
	descEdgeBytes = prometheus.NewDesc("tether_gateway_edge_bytes_total",
		"Bytes relayed over one edge's current tunnel; direction up is toward the edge.",
		[]string{"node", "direction"}, nil)
	descEdgeRefusals = prometheus.NewDesc("tether_gateway_edge_refusals_total",
		"Streams to one edge's current tunnel that were refused, by reason.",
		[]string{"node", "reason"}, nil)
)

var _ prometheus.Collector = (*Registry)(nil)

// Describe implements prometheus.Collector.
func (r *Registry) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEdges, descRegistrations, descStreams, descBytes,
		descEdgeStreams, descEdgeRTT, descEdgeBytes, descEdgeRefusals} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (r *Registry) Collect(ch chan<- prometheus.Metric) {
	edges := r.Edges()
	up, down := r.Totals()
	r.mu.Lock()
	streams := r.streams
	r.mu.Unlock()
	gauge, counter := prometheus.GaugeValue, prometheus.CounterValue

	ch <- prometheus.MustNewConstMetric(descEdges, gauge, float64(len(edges)))
	ch <- prometheus.MustNewConstMetric(descRegistrations, counter, float64(r.registered.Load()-r.replaced.Load()), "new")
	ch <- prometheus.MustNewConstMetric(descRegistrations, counter, float64(r.replaced.Load()), "replaced")
	ch <- prometheus.MustNewConstMetric(descRegistrations, counter, float64(r.refused.Load()), "refused")
	ch <- prometheus.MustNewConstMetric(descStreams, gauge, float64(streams))
	ch <- prometheus.MustNewConstMetric(descBytes, counter, float64(up), "up")
	ch <- prometheus.MustNewConstMetric(descBytes, counter, float64(down), "down")
	for _, e := range edges {
		ch <- prometheus.MustNewConstMetric(descEdgeStreams, gauge, float64(e.Streams), e.Node)
		ch <- prometheus.MustNewConstMetric(descEdgeRTT, gauge, e.RTT.Seconds(), e.Node)
		ch <- prometheus.MustNewConstMetric(descEdgeBytes, counter, float64(e.BytesUp), e.Node, "up")
		ch <- prometheus.MustNewConstMetric(descEdgeBytes, counter, float64(e.BytesDown), e.Node, "down")
		for reason, n := range e.Refusals {
			ch <- prometheus.MustNewConstMetric(descEdgeRefusals, counter, float64(n), e.Node, reason)
		}
	}
}
