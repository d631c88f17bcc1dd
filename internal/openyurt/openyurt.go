// Package openyurt is the one home of the names Tether shares with
// OpenYurt (docs/design.md, "Labels and annotations"): the labels,
// annotations, taint and topology keys that both programs and the
// libraries under them read or write, so that OpenYurt's users switch
// without relabelling. It imports nothing of the project, so every layer
// may use it.
package openyurt

import "strings"

// Node labels.
const (
	// EdgeLabel marks an edge node when it is "true" (the gateway's default
	// --edge-selector).
	EdgeLabel = "openyurt.io/is-edge-worker"
	// PoolLabel names a node's pool. Nodes may not set it on themselves
	// (packaging/kubernetes/node-admission.yaml): pool membership rests on
	// it.
	PoolLabel = "apps.openyurt.io/nodepool"
)

// Annotations and the taint.
const (
	// TopologyKeysAnnotation on a Service selects the topology of its
	// endpoints: one key, or an ordered comma-separated fallback list.
	TopologyKeysAnnotation = "openyurt.io/topologyKeys"
	// UpdateTriggerAnnotation (unix seconds) is stamped on EndpointSlices
	// and Endpoints so that YurtHub edges filter them again.
	UpdateTriggerAnnotation = "openyurt.io/update-trigger"
	// DelegateHeartbeatAnnotation ("true") marks a node Lease the gateway
	// wrote for a node that lost the cloud.
	DelegateHeartbeatAnnotation = "openyurt.io/delegate-heartbeat"
	// UnschedulableTaintKey is set (value "true", effect NoSchedule) on a
	// node whose heartbeats are delegated.
	UnschedulableTaintKey = "node.openyurt.io/unschedulable"
)

// Topology keys, the values of TopologyKeysAnnotation.
const (
	KeyHostname = "kubernetes.io/hostname" // same node
	KeyNodePool = "openyurt.io/nodepool"   // same pool
	KeyZone     = "kubernetes.io/zone"     // same pool, as OpenYurt reads it
	KeyAny      = "*"                      // every endpoint (fallback lists)
)

// IsPoolKey reports whether keys (a TopologyKeysAnnotation value) depends
// on pool membership.
func IsPoolKey(keys string) bool {
	for k := range strings.SplitSeq(keys, ",") {
		switch strings.TrimSpace(k) {
		case KeyNodePool, KeyZone:
			return true
		}
	}
	return false
}

// Node autonomy (gateway/autonomy): the pods of an edge node annotated so
// tolerate its loss of the cloud, as OpenYurt's pod binding controller
// makes them.
const (
	// AutonomyAnnotation ("true") keeps the node's pods bound through an
	// outage of any length. OpenYurt calls it deprecated but still reads it.
	AutonomyAnnotation = "node.beta.openyurt.io/autonomy"
	// AutonomyDurationAnnotation bounds it: a Go duration ("24h"); "0" (or
	// any duration not above zero) means forever.
	AutonomyDurationAnnotation = "node.openyurt.io/autonomy-duration"
	// OriginalNotReadyTolerationAnnotation and
	// OriginalUnreachableTolerationAnnotation on a pod record the
	// tolerationSeconds its not-ready and unreachable tolerations had
	// before autonomy changed them: seconds, or "infinite" for none.
	OriginalNotReadyTolerationAnnotation    = "apps.openyurt.io/original-not-ready-toleration-duration"
	OriginalUnreachableTolerationAnnotation = "apps.openyurt.io/original-unreachable-toleration-duration"
)
