package cache

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
)

// metrics count the upkeep of the cache file's bounds. Open builds them
// (the writer counts from the start); Register registers them, with the
// gauges and the queue's ledger read when scraped.
type metrics struct {
	compactions *prometheus.CounterVec
	reclaimed   prometheus.Counter
	evictions   *prometheus.CounterVec
	expired     prometheus.Counter
	// tokensDropped counts the service-account tokens dropped (tokens.go).
	tokensDropped *prometheus.CounterVec
}

func newMetrics() *metrics {
	return &metrics{
		compactions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_apiserver_cache_compactions_total",
			Help: "Compactions of the cache file, by result: ok, or failed with the file left as it was.",
		}, []string{"result"}),
		reclaimed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_edge_apiserver_cache_compaction_reclaimed_bytes_total",
			Help: "Bytes the cache file shrank by in compactions.",
		}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_apiserver_cache_evictions_total",
			Help: "Resources dropped from the cache because it was over --cache-max-size, by component.",
		}, []string{"component"}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_edge_apiserver_cache_tombstones_expired_total",
			Help: "Tombstones of deleted objects removed for their age.",
		}),
		tokensDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_edge_apiserver_cache_tokens_dropped_total",
			Help: "Service-account tokens dropped from the cache, by reason: expired, pod_deleted, or bound (too many stored).",
		}, []string{"reason"}),
	}
}

// Register registers the metrics of the cache file with reg.
func (s *Store) Register(reg prometheus.Registerer) error {
	u := &s.upkeep
	return promreg.Register(reg,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tether_edge_apiserver_cache_file_bytes",
			Help: "Size of the cache file (apiserver-cache.db).",
		}, func() float64 { return float64(u.fileBytes.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tether_edge_apiserver_cache_used_bytes",
			Help: "Bytes of the cache file's pages that hold data; the rest are free pages that later writes reuse.",
		}, func() float64 { return float64(u.usedBytes.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tether_edge_apiserver_cache_max_bytes",
			Help: "The bound of tether_edge_apiserver_cache_used_bytes, from --cache-max-size; zero means none.",
		}, func() float64 { return float64(u.maxSize) }),
		u.compactions, u.reclaimed, u.evictions, u.expired, u.tokensDropped,
		&ledgerCollector{s: s},
	)
}

var descLedger = prometheus.NewDesc("tether_edge_apiserver_queue_ledger_total",
	"The ledger of the queue of status writes made offline, by event, kept in the cache file across restarts.",
	[]string{"event"}, nil)

// ledgerCollector exports the queue's ledger, read from the file at each
// scrape.
type ledgerCollector struct{ s *Store }

func (c *ledgerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- descLedger }

func (c *ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	l, err := c.s.Ledger()
	if err != nil { // closed, or a counter that does not read: no series rather than a failed scrape
		c.s.log.Warn("cache: the queue's ledger does not read", "err", err)
		return
	}
	for _, e := range []struct {
		name string
		v    uint64
	}{{ledgerEnqueued, l.Enqueued}, {ledgerCoalesced, l.Coalesced}, {ledgerApplied, l.Applied},
		{ledgerObsolete, l.Obsolete}, {ledgerRejected, l.Rejected}, {ledgerResent, l.Resent}} {
		ch <- prometheus.MustNewConstMetric(descLedger, prometheus.CounterValue, float64(e.v), e.name)
	}
}
