package gateway

import (
	"crypto/x509"

	"github.com/prometheus/client_golang/prometheus"
)

// The gateway's parts register their metrics themselves (their Options'
// Registerer); the node watcher, the edge registry and the certificates
// are collectors read when scraped, which the gateway registers as it
// builds them, with the gauge below.

// edgesWithoutTunnelGauge reads edgesWithoutTunnel when scraped.
func (g *Gateway) edgesWithoutTunnelGauge() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tether_gateway_edges_without_tunnel",
		Help: "Edge nodes in the cluster with no live tunnel to this gateway replica.",
	}, g.edgesWithoutTunnel)
}

// edgesWithoutTunnel counts the edge nodes of the latest snapshot that
// have no tunnel to this replica (at scrape time: no series per node).
func (g *Gateway) edgesWithoutTunnel() float64 {
	snap := g.watcher.Snapshot()
	if snap == nil {
		return 0
	}
	n := 0
	for name, node := range snap.Nodes {
		if _, ok := g.registry.Lookup(name); node.Edge && !ok {
			n++
		}
	}
	return float64(n)
}

var descNotAfter = prometheus.NewDesc("tether_gateway_certificate_expiry_timestamp_seconds",
	"When a certificate the gateway uses expires, as a Unix time, by cert: serving or client-ca.",
	[]string{"cert"}, nil)

// Describe and Collect make tlsSource a Prometheus collector of its
// certificates' expiry, so that an alert can fire before edges start
// refusing the gateway, or it them.
func (s *tlsSource) Describe(ch chan<- *prometheus.Desc) { ch <- descNotAfter }

func (s *tlsSource) Collect(ch chan<- prometheus.Metric) {
	if leaf := s.servingLeaf(); leaf != nil {
		ch <- prometheus.MustNewConstMetric(descNotAfter, prometheus.GaugeValue, float64(leaf.NotAfter.Unix()), "serving")
	}
	var first *x509.Certificate
	for _, c := range s.clientCAs.Certificates() {
		if first == nil || c.NotAfter.Before(first.NotAfter) {
			first = c
		}
	}
	if first != nil {
		ch <- prometheus.MustNewConstMetric(descNotAfter, prometheus.GaugeValue, float64(first.NotAfter.Unix()), "client-ca")
	}
}
