package writequeue

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
)

type metrics struct {
	// replayed counts the writes that left the queue, by result.
	replayed *prometheus.CounterVec
	// length is the number of queued writes.
	length prometheus.GaugeFunc
}

func newMetrics(reg prometheus.Registerer, queueLen func() float64) (*metrics, error) {
	m := &metrics{
		replayed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_edge_apiserver_queue_replayed_total",
			Help: "Queued status writes that left the queue, by result: applied, rebased, obsolete, rejected or coalesced."},
			[]string{"result"}),
		length: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tether_edge_apiserver_queue_length",
			Help: "Status writes made offline and not yet replayed to the cloud."}, queueLen),
	}
	return m, promreg.Register(reg, m.replayed, m.length)
}
