package poolstore

import "github.com/tether-edge/tether/internal/openyurt"

// Names shared by the edge (election, replication) and the gateway
// (delegated heartbeats, taints). They are OpenYurt's where OpenYurt has
// one, so that its users keep their labels.
const (
	// PoolLabel on a Node names its pool.
	PoolLabel = openyurt.PoolLabel
	// RecordNamespace holds the pools' records, election and sync: both
	// are ConfigMaps, not Leases (lock.go says why).
	RecordNamespace = "tether-system"
	// DelegateHeartbeatAnnotation marks a node Lease written by the
	// gateway on behalf of a node that lost the cloud.
	DelegateHeartbeatAnnotation = openyurt.DelegateHeartbeatAnnotation
	// UnschedulableTaintKey is set (value "true", effect NoSchedule) on a
	// node whose heartbeats are delegated.
	UnschedulableTaintKey = openyurt.UnschedulableTaintKey
	// DefaultPort is the pool listener's port.
	DefaultPort = 10269
)

// ElectionRecordName is the name of pool's election record, a ConfigMap in
// RecordNamespace: "pool-<pool>".
func ElectionRecordName(pool string) string { return "pool-" + pool }

// SyncRecordName is the name of the record, a ConfigMap in RecordNamespace,
// that the leader of pool renews while its watches are synced
// (leader-informer-sync): "pool-<pool>-sync".
func SyncRecordName(pool string) string { return "pool-" + pool + "-sync" }
