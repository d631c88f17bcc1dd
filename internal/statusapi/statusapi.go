// Package statusapi is the one home of the JSON that the admin endpoints'
// /status serve: tether-gateway's (Gateway) and tether-edge's (Edge). It
// is a contract with operators: tetherctl, the end-to-end tests and
// whatever an operator scripts read these field names, so they do not
// change. The programs fill these types; their readers import this
// package, not the programs (internal/layering). It imports nothing of
// the project, so every layer may use it.
package statusapi

import (
	"net/netip"
	"time"
)

// Gateway is what a tether-gateway replica's /status serves: the replica
// and the edges connected to it.
type Gateway struct {
	Replica  string    `json:"replica"`
	Hostname string    `json:"hostname"`
	Version  string    `json:"version"`
	Started  time.Time `json:"started"`
	Mode     string    `json:"mode"`
	Ready    bool      `json:"ready"`
	// NotReady says why Ready is false.
	NotReady string `json:"notReady,omitempty"`
	// EdgeNodes counts the edge nodes in the cluster, connected or not.
	EdgeNodes int             `json:"edgeNodes"`
	Edges     []ConnectedEdge `json:"edges"`
	// AddressRefusals are the addresses edge nodes claim that this replica
	// does not route to them, with the reason.
	AddressRefusals []AddressRefusal `json:"addressRefusals,omitempty"`
	// PodRangeRefusals are the pod ranges of edge nodes that this replica
	// does not route to them, with the reason.
	PodRangeRefusals []PodRangeRefusal `json:"podRangeRefusals,omitempty"`
}

// ConnectedEdge is one edge connected to a gateway replica.
type ConnectedEdge struct {
	Node string `json:"node"`
	// Pool is the node's pool label; empty when the node has none or is
	// not (yet) known from the cluster.
	Pool           string           `json:"pool,omitempty"`
	Remote         string           `json:"remote"`
	ConnectedSince time.Time        `json:"connectedSince"`
	RTTMillis      float64          `json:"rttMs"`
	Streams        int64            `json:"streams"`
	BytesUp        int64            `json:"bytesUp"`   // toward the edge
	BytesDown      int64            `json:"bytesDown"` // from the edge
	Refusals       map[string]int64 `json:"refusals,omitempty"`
}

// AddressRefusal is one address an edge node claims that the gateway
// does not route to it.
type AddressRefusal struct {
	Addr netip.Addr `json:"address"`
	Node string     `json:"node"`
	// Reason is one of gateway/nodewatch's Reasons: conflict, cloud_node,
	// gateway_host, outside_ranges, not_unicast.
	Reason string `json:"reason"`
	// Holder is, for a conflict, the node the address goes to; "" when it
	// goes to none.
	Holder string `json:"holder,omitempty"`
}

// PodRangeRefusal is one pod range of an edge node (spec.podCIDRs) that
// the gateway does not route to it.
type PodRangeRefusal struct {
	Prefix netip.Prefix `json:"prefix"`
	Node   string       `json:"node"`
	// Reason is one of gateway/nodewatch's PodReasons: conflict,
	// cloud_node, gateway_host, outside_ranges, too_wide.
	Reason string `json:"reason"`
	// With names, for a conflict or a cloud node, the other node.
	With string `json:"with,omitempty"`
}

// Edge is what tether-edge's /status serves.
type Edge struct {
	Node     string              `json:"node"`
	Version  string              `json:"version"`
	Gateways []GatewayConnection `json:"gateways"`
	// APIServer is the apiserver proxy's part; nil when it does not run.
	APIServer *APIServer `json:"apiserver,omitempty"`
	// Pool is the node pool's part; nil when the edge runs no node pool
	// (no apiserver proxy, --pool-listen empty, its Node in no pool, or
	// its Node not read yet).
	Pool *Pool `json:"pool,omitempty"`
}

// GatewayConnection is the edge's tunnel to one gateway replica.
type GatewayConnection struct {
	Gateway    string `json:"gateway"` // resolved address
	Entry      string `json:"entry"`   // the --gateway entry it came from
	ServerName string `json:"server_name"`
	Connected  bool   `json:"connected"`
	// Since is when the replica last connected, or last disconnected
	// (when it was added, if it never connected).
	Since       time.Time `json:"since"`
	RTTSeconds  float64   `json:"rtt_seconds,omitempty"`
	StreamsOpen int64     `json:"streams_open"`
	Streams     int64     `json:"streams_total"`
	BytesUp     int64     `json:"bytes_up"`   // edge to cloud
	BytesDown   int64     `json:"bytes_down"` // cloud to edge
	Reconnects  int64     `json:"reconnects"`
	LastError   string    `json:"last_error,omitempty"`
}

// APIServer is the edge's apiserver proxy: its own state and the cloud
// apiservers it reaches.
type APIServer struct {
	Healthy       bool           `json:"healthy"`
	QueuedWrites  int            `json:"queuedWrites"`
	CachedObjects map[string]int `json:"cachedObjects"`
	// Servers are the cloud apiservers, in priority order.
	Servers []Upstream `json:"servers"`
	// QueueLedger accounts for every status write queued offline since
	// the cache file was created; nil if it does not read.
	QueueLedger *QueueLedger `json:"queueLedger,omitempty"`
}

// QueueLedger is the ledger of the edge's queue of status writes made
// offline, kept in its cache file (edgeproxy/cache) and updated in the
// transaction of each event, so that it survives restarts and kill -9.
// Enqueued = Coalesced + Applied + Obsolete + Rejected + Queued when
// Balanced.
type QueueLedger struct {
	Enqueued  uint64 `json:"enqueued"`  // queued (a coalescing replacement too)
	Coalesced uint64 `json:"coalesced"` // replaced by a later patch of the object
	Applied   uint64 `json:"applied"`   // dequeued after a 2xx
	Obsolete  uint64 `json:"obsolete"`  // dequeued as no longer wanted
	Rejected  uint64 `json:"rejected"`  // dequeued after a final 4xx
	Queued    int    `json:"queued"`    // in the queue now
	// Resent counts sends of a write an earlier send may have applied (a
	// kill between send and dequeue, no answer, a 5xx): status merge
	// patches setting values apply the same twice.
	Resent uint64 `json:"resent"`
	// Unconfirmed counts queued writes marked as being sent whose
	// outcome is unknown: their next send counts as resent.
	Unconfirmed int  `json:"unconfirmed"`
	Balanced    bool `json:"balanced"`
}

// Upstream is one cloud apiserver as the edge's health checks see it.
type Upstream struct {
	Server    string    `json:"server"`
	Healthy   bool      `json:"healthy"`
	Known     bool      `json:"known"`
	LastError string    `json:"lastError,omitempty"`
	LastProbe time.Time `json:"lastProbe,omitzero"`
	Since     time.Time `json:"since,omitzero"`
	Probes    uint64    `json:"probes"`
}

// Pool is the edge's node pool replica.
type Pool struct {
	Pool     string    `json:"pool"`
	Role     string    `json:"role"` // leader, follower, or none (no leader known)
	Leader   string    `json:"leader,omitempty"`
	Epoch    string    `json:"epoch,omitempty"`
	Rev      uint64    `json:"rev"`
	Objects  int       `json:"objects"`
	SyncedAt time.Time `json:"lastSync,omitzero"`
	Fresh    bool      `json:"fresh"`
	Digest   string    `json:"digest"`
	// Replication is the follower's side (on a follower).
	Replication *Replication `json:"replication,omitempty"`
}

// Replication is a follower's stream from its pool's leader.
type Replication struct {
	// Leader is the node streamed from ("" when not connected).
	Leader    string    `json:"leader,omitempty"`
	Connected bool      `json:"connected"`
	LastFrame time.Time `json:"lastFrame,omitzero"`
	// LeaderRev is the leader's revision in its last frame, Rev the
	// replica's, Lag the difference while they are of one epoch.
	LeaderRev uint64 `json:"leaderRev"`
	Rev       uint64 `json:"rev"`
	Lag       uint64 `json:"lag"`
	// Resyncs counts the snapshots loaded.
	Resyncs   uint64 `json:"resyncs"`
	LastError string `json:"lastError,omitempty"`
}
