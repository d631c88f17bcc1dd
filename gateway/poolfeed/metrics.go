package poolfeed

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
	"github.com/tether-edge/tether/tunnel"
)

// Reasons a subscription ended, counted by
// tether_gateway_pool_feed_ended_total.
const (
	endBehind    = "behind"     // it fell behind the log: it subscribes again
	endWrite     = "write"      // a write to the stream failed (the edge ended it)
	endCanceled  = "canceled"   // the caller ended it (the sender no longer leads, the tunnel closed)
	endNotLeader = "not_leader" // the sender no longer leads its pool (Handler)
)

var endReasons = []string{endBehind, endWrite, endCanceled, endNotLeader}

type metrics struct {
	subscribers prometheus.Gauge
	units       *prometheus.CounterVec
	bytes       prometheus.Counter
	ended       *prometheus.CounterVec
	refusals    *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, resources []string) (*metrics, error) {
	m := &metrics{
		subscribers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tether_gateway_pool_feed_subscribers",
			Help: "Pool leaders this gateway replica streams its signed pool feed to.",
		}),
		units: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_pool_feed_units_total",
			Help: "Signed units of changes to a pool resource that this replica produced, by resource.",
		}, []string{"resource"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_gateway_pool_feed_bytes_total",
			Help: "Bytes of pool feed frames written to pool leaders, before compression.",
		}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_pool_feed_ended_total",
			Help: "Pool feed subscriptions that ended, by reason.",
		}, []string{"reason"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_pool_feed_refusals_total",
			Help: "Pool feed requests refused, by the reply's code.",
		}, []string{"code"}),
	}
	for _, r := range resources {
		m.units.WithLabelValues(r)
	}
	for _, c := range append(tunnel.PoolFeedCodes(), tunnel.RateLimited) {
		if c != tunnel.OK {
			m.refusals.WithLabelValues(c.String())
		}
	}
	for _, r := range endReasons {
		m.ended.WithLabelValues(r)
	}
	return m, promreg.Register(reg, m.subscribers, m.units, m.bytes, m.ended, m.refusals)
}
