package heartbeat

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
	"github.com/tether-edge/tether/tunnel"
)

// metrics count the delegated heartbeats by result and what their writes
// cost.
type metrics struct {
	results   *prometheus.CounterVec
	clamped   *prometheus.CounterVec
	reads     *prometheus.CounterVec
	throttled prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_delegated_heartbeats_total",
			Help: "Delegated heartbeats (Lease renewals a pool leader sends for a member) by result: ok or the refusal's code.",
		}, []string{"result"}),
		clamped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_delegated_heartbeats_clamped_total",
			Help: "Delegated heartbeats whose renewTime was later than the gateway's clock, by reason.",
		}, []string{"reason"}),
		reads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_delegated_heartbeat_lease_reads_total",
			Help: "Node Leases read with a GET to write a delegated heartbeat, by reason: not_cached or conflict.",
		}, []string{"reason"}),
		throttled: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_gateway_delegated_heartbeats_throttled_total",
			Help: "Delegated heartbeats answered unavailable because the apiserver request budget had no token in time.",
		}),
	}
	for _, c := range tunnel.DelegateCodes() {
		m.results.WithLabelValues(c.String())
	}
	for _, r := range []string{clampedSent, clampedStored} {
		m.clamped.WithLabelValues(r)
	}
	for _, r := range []string{readNotCached, readConflict} {
		m.reads.WithLabelValues(r)
	}
	return m, promreg.Register(reg, m.results, m.clamped, m.reads, m.throttled)
}

// result counts one request's result: OK or the refusal's code.
func (m *metrics) result(c tunnel.Code) { m.results.WithLabelValues(c.String()).Inc() }
