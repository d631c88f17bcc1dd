package poolstore

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
)

const metricsNS, metricsSub = "tether", "edge_pool"

// Results of a delegated heartbeat, the "result" label of
// tether_edge_pool_heartbeats_total.
const (
	heartbeatAccepted   = "accepted"    // passed on by Delegate
	heartbeatRefused    = "refused"     // another node's Lease (403)
	heartbeatBadRequest = "bad_request" // not a Lease, too large (4xx)
	heartbeatNotLeader  = "not_leader"  // this node does not lead (503)
	heartbeatFailed     = "failed"      // Delegate failed (503)
)

// serverMetrics are the pool listener's.
type serverMetrics struct {
	refused    *prometheus.CounterVec
	streams    prometheus.Gauge
	ended      *prometheus.CounterVec
	frames     *prometheus.CounterVec
	bytes      prometheus.Counter
	heartbeats *prometheus.CounterVec
}

func newServerMetrics(reg prometheus.Registerer) (*serverMetrics, error) {
	m := &serverMetrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNS, Subsystem: metricsSub, Name: "peers_refused_total",
			Help: "Peers refused by the pool listener, by reason: no_certificate, bad_certificate, not_a_node (TLS handshake failed); unknown_node, other_pool, no_pool (answered 403)."},
			[]string{"reason"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: metricsNS, Subsystem: metricsSub, Name: "streams_serving",
			Help: "Replication streams this node serves now (to followers, while it leads)."}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNS, Subsystem: metricsSub, Name: "streams_ended_total",
			Help: "Replication streams ended, by reason: follower_gone, behind (the follower fell behind the change log; it resyncs), new_term, not_leader, write_failed."},
			[]string{"reason"}),
		frames: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNS, Subsystem: metricsSub, Name: "frames_sent_total",
			Help: "Replication frames sent to followers, by type: snapshot, objects, changes, sync."},
			[]string{"type"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: metricsNS, Subsystem: metricsSub, Name: "bytes_sent_total",
			Help: "Bytes of replication frames sent to followers."}),
		heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNS, Subsystem: metricsSub, Name: "heartbeats_total",
			Help: "Lease renewals members sent to be delegated, by result: accepted, refused (another node's Lease), bad_request, not_leader, failed (could not be passed on)."},
			[]string{"result"}),
	}
	for _, r := range refusalReasons {
		m.refused.WithLabelValues(r)
	}
	for _, t := range frameTypes {
		m.frames.WithLabelValues(t)
	}
	for _, r := range []string{endedFollowerGone, endedBehind, endedNewTerm, endedNotLeader, endedWriteFailed} {
		m.ended.WithLabelValues(r)
	}
	for _, r := range []string{heartbeatAccepted, heartbeatRefused, heartbeatBadRequest, heartbeatNotLeader, heartbeatFailed} {
		m.heartbeats.WithLabelValues(r)
	}
	return m, promreg.Register(reg, m.refused, m.streams, m.ended, m.frames, m.bytes, m.heartbeats)
}

// followerMetrics are the replication client's.
type followerMetrics struct {
	refused   *prometheus.CounterVec
	frames    *prometheus.CounterVec
	bytes     prometheus.Counter
	resyncs   prometheus.Counter
	connected prometheus.Gauge
	lag       prometheus.Gauge
}

func newFollowerMetrics(reg prometheus.Registerer) (*followerMetrics, error) {
	m := &followerMetrics{
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNS, Subsystem: metricsSub, Name: "leaders_refused_total",
			Help: "Leaders this follower refused to replicate from, by reason: unknown_node, other_pool (the leader is not a member of this node's pool), no_pool (this node's pool is unknown), counted once a leader until a stream opens; too_many_objects, too_large (the replica would pass its bounds), sync_in_future (a sync mark ahead of this node's clock), counted per stream ended."},
			[]string{"reason"}),
		frames: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNS, Subsystem: metricsSub, Name: "frames_received_total",
			Help: "Replication frames received from the leader, by type: snapshot, objects, changes, sync."},
			[]string{"type"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: metricsNS, Subsystem: metricsSub, Name: "bytes_received_total",
			Help: "Bytes of replication frames received from the leader."}),
		resyncs: prometheus.NewCounter(prometheus.CounterOpts{Namespace: metricsNS, Subsystem: metricsSub, Name: "resyncs_total",
			Help: "Snapshots of the leader's store loaded into the replica (first sync, new leader term, follower too far behind, gap)."}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: metricsNS, Subsystem: metricsSub, Name: "replica_connected",
			Help: "1 while the replica streams from the leader, else 0."}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: metricsNS, Subsystem: metricsSub, Name: "replica_lag_revisions",
			Help: "The leader's revision in its last frame minus the replica's (0 when caught up or unknown)."}),
	}
	for _, t := range frameTypes {
		m.frames.WithLabelValues(t)
	}
	for _, r := range leaderRefusalReasons {
		m.refused.WithLabelValues(r)
	}
	return m, promreg.Register(reg, m.refused, m.frames, m.bytes, m.resyncs, m.connected, m.lag)
}
