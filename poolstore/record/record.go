// Package record is the contract of a node pool's records in the cloud,
// the one part of the pool that tether-edge and tether-gateway share:
// their names, the two ConfigMaps' encoding, and the interfaces through
// which a node reads them and has them written.
//
// Both records are ConfigMaps in Namespace:
//
//	pool-<pool>       election: client-go's leader record in the annotation
//	                  ElectionAnnotation (Election)
//	pool-<pool>-sync  the leader's sync mark (leader-informer-sync): Sync in
//	                  the data keys holderIdentity, renewTime,
//	                  leaseDurationSeconds
//
// They are ConfigMaps, not Leases: kube-apiserver's NodeRestriction
// admission lets a node identity write no Lease but its own in
// kube-node-lease, whatever RBAC grants. Nodes only read them, though:
// RBAC cannot tell one pool's ConfigMap from another's, nor admission the
// requesting node's pool, so a node allowed to write ConfigMaps in
// Namespace could write every pool's. A Writer writes them on the node's
// behalf: in tether-edge the gateway, through the tunnel, after checking
// that the node is in the pool and that the record names it
// (gateway/election).
//
// The package imports nothing of the project, so that the gateway links
// the records without the pool's store, replication or serving.
package record

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Namespace holds the pools' records, election and sync.
const Namespace = "tether-system"

// ElectionName is the name of pool's election record, a ConfigMap in
// Namespace: "pool-<pool>".
func ElectionName(pool string) string { return "pool-" + pool }

// SyncName is the name of the record, a ConfigMap in Namespace, that the
// leader of pool renews while its watches are synced
// (leader-informer-sync): "pool-<pool>-sync".
func SyncName(pool string) string { return "pool-" + pool + "-sync" }

// Kind says which of its pool's records a write is for.
type Kind uint8

// The records of a pool, both ConfigMaps in Namespace.
const (
	KindElection Kind = 1 // ElectionName(pool): who leads
	KindSync     Kind = 2 // SyncName(pool): the leader's sync mark
)

// Write is one write of a pool's record.
type Write struct {
	Kind Kind
	Pool string
	// Create asks to create ConfigMap, which does not exist; otherwise it
	// is updated from its ResourceVersion, which must be the stored one.
	Create    bool
	ConfigMap *corev1.ConfigMap
}

// Writer writes a pool's records on a node's behalf and returns them as
// stored. Errors are the apiserver's where it answered (a changed record
// is a conflict, apierrors.IsConflict); the elector treats any error as a
// failed try.
type Writer interface {
	WriteRecord(ctx context.Context, w Write) (*corev1.ConfigMap, error)
}

// ConfigMapGetter reads the ConfigMaps of Namespace: the clientset's
// CoreV1().ConfigMaps(Namespace) or internal/kube's
// ConfigMaps(Namespace).
type ConfigMapGetter interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.ConfigMap, error)
}

// ConfigMapWriter writes the ConfigMaps of Namespace, as ConfigMapGetter
// reads them.
type ConfigMapWriter interface {
	Create(ctx context.Context, cm *corev1.ConfigMap, opts metav1.CreateOptions) (*corev1.ConfigMap, error)
	Update(ctx context.Context, cm *corev1.ConfigMap, opts metav1.UpdateOptions) (*corev1.ConfigMap, error)
}

// ClientWriter is a Writer that writes with a client of its own, whose
// identity RBAC must let write ConfigMaps in Namespace: an
// administrator's or the gateway's, not a node's (the shipped
// pool-rbac.yaml lets nodes only read them).
type ClientWriter struct{ ConfigMaps ConfigMapWriter }

var _ Writer = ClientWriter{}

// WriteRecord implements Writer.
func (c ClientWriter) WriteRecord(ctx context.Context, w Write) (*corev1.ConfigMap, error) {
	if w.Create {
		return c.ConfigMaps.Create(ctx, w.ConfigMap, metav1.CreateOptions{})
	}
	return c.ConfigMaps.Update(ctx, w.ConfigMap, metav1.UpdateOptions{})
}
