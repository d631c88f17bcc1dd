package poolstore

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/internal/promreg"
)

// The package's metrics, tether_edge_pool_*, in three groups, each
// registered by the part that counts them: the pool listener's
// (NewServer), the replica's stream (NewFollower) and the Pool's gauges
// (New). The labels' values are listed in README.md, "Metrics".

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
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_edge_pool_peers_refused_total",
			Help: "Peers the pool listener refused, at the TLS handshake or as forbidden, by reason."},
			[]string{"reason"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_edge_pool_streams_serving",
			Help: "Replication streams this node serves now, to followers while it leads."}),
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_edge_pool_streams_ended_total",
			Help: "Replication streams ended, by reason (behind: the follower fell behind the change log and resyncs)."},
			[]string{"reason"}),
		frames: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_edge_pool_frames_sent_total",
			Help: "Replication frames sent to followers, by type: snapshot, objects, changes, sync."},
			[]string{"type"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_edge_pool_bytes_sent_total",
			Help: "Bytes of replication frames sent to followers."}),
		heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_edge_pool_heartbeats_total",
			Help: "Lease renewals members sent this node to be delegated, by result."},
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
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_edge_pool_leaders_refused_total",
			Help: "Leaders this follower refused to stream from, or whose stream it ended for what it sent, by reason."},
			[]string{"reason"}),
		frames: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_edge_pool_frames_received_total",
			Help: "Replication frames received from the leader, by type: snapshot, objects, changes, sync."},
			[]string{"type"}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_edge_pool_bytes_received_total",
			Help: "Bytes of replication frames received from the leader."}),
		resyncs: prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_edge_pool_resyncs_total",
			Help: "Snapshots of the leader's store loaded into the replica (first sync, new term, fallen behind, gap)."}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_edge_pool_replica_connected",
			Help: "Whether the replica streams from the leader: one if it does, else zero."}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_edge_pool_replica_lag_revisions",
			Help: "The leader's revision in its last frame minus the replica's; zero when caught up or unknown."}),
	}
	for _, t := range frameTypes {
		m.frames.WithLabelValues(t)
	}
	for _, r := range leaderRefusalReasons {
		m.refused.WithLabelValues(r)
	}
	return m, promreg.Register(reg, m.refused, m.frames, m.bytes, m.resyncs, m.connected, m.lag)
}

// poolMetrics are the Pool's gauges, read from it at each scrape.
type poolMetrics struct {
	leader, follower, revision, objects, syncAge prometheus.GaugeFunc
}

func newPoolMetrics(reg prometheus.Registerer, p *Pool) (*poolMetrics, error) {
	role := func(r string) func() float64 {
		return func() float64 {
			if p.roleOf(p.Leader()) == r {
				return 1
			}
			return 0
		}
	}
	m := &poolMetrics{
		leader: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tether_edge_pool_leader",
			Help: "Whether this node leads its pool: one if it does, else zero."}, role("leader")),
		follower: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tether_edge_pool_follower",
			Help: "Whether this node follows a known leader: one if it does, else zero."}, role("follower")),
		revision: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tether_edge_pool_revision",
			Help: "The replica's revision in the current leader's term."}, func() float64 { return float64(p.o.Store.Rev()) }),
		objects: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tether_edge_pool_objects",
			Help: "Objects in the replica."}, func() float64 { return float64(p.o.Store.Len()) }),
		syncAge: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "tether_edge_pool_last_sync_age_seconds",
			Help: "Age of the leader's last sync as the replica knows it; negative if it knows none."},
			func() float64 {
				if at := p.o.Store.SyncedAt(); !at.IsZero() {
					return time.Since(at).Seconds()
				}
				return -1
			}),
	}
	return m, promreg.Register(reg, m.leader, m.follower, m.revision, m.objects, m.syncAge)
}
