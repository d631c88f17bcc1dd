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
	Expires time.Time
}

// ReadLeader reads pool's election record from cms, the ConfigMaps of
// Namespace (the gateway checks it before it writes a delegated
// heartbeat). A pool without a record, or whose record names no holder,
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
	return Leader{Holder: rec.HolderIdentity, Renewed: rec.RenewTime.Time,
		Expires: rec.RenewTime.Add(time.Duration(rec.LeaseDurationSeconds) * time.Second)}, nil
}
