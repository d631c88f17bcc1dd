package record

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ElectionAnnotation is the ConfigMap annotation that holds the election
// record (client-go's resourcelock.LeaderElectionRecordAnnotationKey).
const ElectionAnnotation = "control-plane.alpha.kubernetes.io/leader"

// Election is client-go's resourcelock.LeaderElectionRecord with the same
// JSON names and types, so that records written by client-go's leader
// election (which earlier versions of tether-edge ran) and by poolstore's
// elector read alike. client-go's fields for coordinated leader election,
// strategy and preferredHolder, are not written; client-go reads them as
// empty.
type Election struct {
	// HolderIdentity is the node that holds the record; "" when none
	// does (released): any candidate may take it at once.
	HolderIdentity       string      `json:"holderIdentity"`
	LeaseDurationSeconds int         `json:"leaseDurationSeconds"`
	AcquireTime          metav1.Time `json:"acquireTime"`
	RenewTime            metav1.Time `json:"renewTime"`
	LeaderTransitions    int         `json:"leaderTransitions"`
}

// DefaultLeaseDuration is a pool's election lease unless configured
// otherwise: tether-edge's and tether-gateway's --pool-lease-duration,
// which must be equal (a record's own leaseDurationSeconds is never
// trusted beyond it; see Election.Lease).
const DefaultLeaseDuration = 15 * time.Second

// Lease is how long r holds, bounded by max, the lease duration the
// reader is configured with: leaseDurationSeconds is written by a node,
// which could otherwise hold the lead for as long as it likes. The
// seconds are clamped to [0, max] before they are multiplied, so that no
// value overflows a time.Duration.
func (r Election) Lease(max time.Duration) time.Duration {
	secs := int64(r.LeaseDurationSeconds)
	switch {
	case secs <= 0 || max <= 0:
		return 0
	case secs >= int64(max/time.Second):
		return max
	}
	return time.Duration(secs) * time.Second
}

// DecodeElection is cm's election record (its ElectionAnnotation); a
// ConfigMap without the annotation holds an empty one.
func DecodeElection(cm *corev1.ConfigMap) (Election, error) {
	var rec Election
	if raw := cm.Annotations[ElectionAnnotation]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &rec); err != nil {
			return Election{}, err
		}
	}
	return rec, nil
}

// SetElection writes rec into cm's ElectionAnnotation.
func SetElection(cm *corev1.ConfigMap, rec Election) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[ElectionAnnotation] = string(raw)
	return nil
}

// Leader is who a pool's election record names, as the cloud holds it.
type Leader struct {
	Holder  string
	Renewed time.Time
	// LeaseSeconds is the record's leaseDurationSeconds as written, which
	// its holder chose: read the expiry with Expires.
	LeaseSeconds int
}

// Expires is when l's lease runs out for a reader configured with the
// lease duration max: Renewed plus the record's lease, at most max.
func (l Leader) Expires(max time.Duration) time.Time {
	return l.Renewed.Add(Election{LeaseDurationSeconds: l.LeaseSeconds}.Lease(max))
}

// ReadLeader reads pool's election record from cms, the ConfigMaps of
// Namespace (the gateway checks it before it writes a delegated
// heartbeat); its expiry is bounded by the reader's own lease duration
// (Leader.Expires). A pool without a record, or whose record names no holder,
// is an error that apierrors.IsNotFound recognises.
func ReadLeader(ctx context.Context, cms ConfigMapGetter, pool string) (Leader, error) {
	name := ElectionName(pool)
	cm, err := cms.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return Leader{}, err
	}
	rec, err := DecodeElection(cm)
	if err != nil {
		return Leader{}, fmt.Errorf("election record %s/%s: %w", Namespace, name, err)
	}
	if rec.HolderIdentity == "" {
		return Leader{}, apierrors.NewNotFound(corev1.Resource("configmaps"), name)
	}
	return Leader{Holder: rec.HolderIdentity, Renewed: rec.RenewTime.Time, LeaseSeconds: rec.LeaseDurationSeconds}, nil
}
