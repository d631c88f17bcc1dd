package apiproxy

import (
	"io"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
)

// How a request was served, the "served" label of requests_total.
const (
	servedUpstream = "upstream" // by the cloud
	servedCache    = "cache"    // offline, from the cache
	servedLocal    = "local"    // offline, answered by the proxy (the node's Lease)
	servedQueued   = "queued"   // offline, kept for replay (status writes)
	servedRefused  = "refused"  // offline, refused with 503
	servedError    = "error"    // a bad request, or the cache failed
	// servedPool (viapool.go): from the node pool's replica.
)

type metrics struct {
	requests      *prometheus.CounterVec
	hits, misses  *prometheus.CounterVec
	bytes         *prometheus.CounterVec
	bytesUp       prometheus.Counter
	bytesDown     prometheus.Counter
	watchesOpen   *prometheus.GaugeVec
	cacheFailures prometheus.Counter
	delegated     *prometheus.CounterVec
	// poolWatchesEnded counts watches served from the pool's replica that
	// the proxy ended because the replica stopped serving.
	poolWatchesEnded prometheus.Counter
	// Service-account tokens (token.go): kept online, served and refused
	// offline.
	tokensStored, tokensServed, tokensRefused *prometheus.CounterVec
	// The pod listener (podapi.go): requests by how served, and pods'
	// answers that could not be kept for offline use.
	podRequests      *prometheus.CounterVec
	podCacheFailures prometheus.Counter
}

// The queue's metrics (queue_length, queue_replayed_total) are package
// writequeue's.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_edge_apiserver_requests_total",
			Help: "Requests of node components, by component, verb and how served: upstream, pool, cache, local, queued, refused or error."},
			[]string{"component", "verb", "served"}),
		hits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_edge_apiserver_cache_hits_total",
			Help: "Reads answered from the cache (offline, or after the cloud failed to answer), by component."},
			[]string{"component"}),
		misses: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_edge_apiserver_cache_misses_total",
			Help: "Reads the cache could not answer (the object or resource was never cached for this component), by component."},
			[]string{"component"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_edge_apiserver_bytes_total",
			Help: "Bytes of request (up) and response (down) bodies between the proxy and the cloud kube-apiservers."},
			[]string{"direction"}),
		watchesOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tether_edge_apiserver_watches_open",
			Help: "Watches of node components open now, by mode: upstream (relayed) or held (offline, without events)."},
			[]string{"mode"}),
		cacheFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_edge_apiserver_cache_update_failures_total",
			Help: "Responses that passed through but could not be cached (undecodable, or the store failed)."}),
		delegated: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_edge_apiserver_heartbeats_delegated_total",
			Help: "Renewals of the node's Lease made offline and sent to the pool leader, by result: ok, failed or dropped."},
			[]string{"result"}),
		poolWatchesEnded: prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_edge_apiserver_pool_watches_ended_total",
			Help: "Watches served from the node pool's replica that were ended because the replica stopped serving."}),
		tokensStored: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_edge_apiserver_tokens_stored_total",
			Help: "Service-account tokens the cloud issued to node components, kept to be served offline, by component."},
			[]string{"component"}),
		tokensServed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_edge_apiserver_tokens_served_offline_total",
			Help: "Token requests answered offline with the last token the cloud issued for them, by component."},
			[]string{"component"}),
		tokensRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_edge_apiserver_tokens_refused_offline_total",
			Help: "Token requests refused offline, by component and reason: missing, other_uid, expired or unreadable."},
			[]string{"component", "reason"}),
		podRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_edge_pod_api_requests_total",
			Help: "Requests of pods on the pod API listener, by how served: cloud, cache, refused or error."},
			[]string{"served"}),
		podCacheFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_edge_pod_api_cache_failures_total",
			Help: "Pods' read answers relayed but not kept for offline use (too large, or the disk write failed)."}),
	}
	m.bytesUp, m.bytesDown = m.bytes.WithLabelValues("up"), m.bytes.WithLabelValues("down")
	return m, promreg.Register(reg, m.requests, m.hits, m.misses, m.bytes, m.watchesOpen, m.cacheFailures, m.delegated, m.poolWatchesEnded,
		m.tokensStored, m.tokensServed, m.tokensRefused, m.podRequests, m.podCacheFailures)
}

// countingReader counts the bytes read through it.
type countingReader struct {
	io.ReadCloser
	c prometheus.Counter
}

func (r *countingReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if n > 0 {
		r.c.Add(float64(n))
	}
	return n, err
}
