package poolstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/kube"
)

// The election record lives in a ConfigMap, not a Lease: kube-apiserver's
// NodeRestriction admission lets a node identity write no Lease but its
// own in kube-node-lease, whatever RBAC grants, and the pool's nodes
// campaign with their node identities. A ConfigMap in LeaseNamespace with
// client-go's leader record annotation (the format of client-go's former
// ConfigMap lock) is what RBAC can grant them.

// electionAnnotation is the ConfigMap annotation that holds the record
// (client-go's resourcelock.LeaderElectionRecordAnnotationKey).
const electionAnnotation = "control-plane.alpha.kubernetes.io/leader"

// electionRecord is client-go's resourcelock.LeaderElectionRecord with
// the same JSON names and types, so that records written by client-go's
// leader election (which earlier versions of tether-edge ran) and by this
// package read alike. client-go's fields for coordinated leader election,
// strategy and preferredHolder, are not written; client-go reads them as
// empty.
type electionRecord struct {
	// HolderIdentity is the node that holds the record; "" when none
	// does (released): any candidate may take it at once.
	HolderIdentity       string      `json:"holderIdentity"`
	LeaseDurationSeconds int         `json:"leaseDurationSeconds"`
	AcquireTime          metav1.Time `json:"acquireTime"`
	RenewTime            metav1.Time `json:"renewTime"`
	LeaderTransitions    int         `json:"leaderTransitions"`
}

// ConfigMapGetter reads the ConfigMaps of LeaseNamespace: the
// clientset's CoreV1().ConfigMaps(LeaseNamespace) or kube's
// ConfigMaps(LeaseNamespace).
type ConfigMapGetter interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.ConfigMap, error)
}

// configMaps are the ConfigMaps of LeaseNamespace as the elector reads
// and writes them.
type configMaps interface {
	ConfigMapGetter
	Create(ctx context.Context, cm *corev1.ConfigMap, opts metav1.CreateOptions) (*corev1.ConfigMap, error)
	Update(ctx context.Context, cm *corev1.ConfigMap, opts metav1.UpdateOptions) (*corev1.ConfigMap, error)
}

var _ configMaps = (*kube.ConfigMaps)(nil)

// recordLock reads and writes the record in the ConfigMap
// LeaseNamespace/name.
type recordLock struct {
	cms  configMaps
	name string
	cm   *corev1.ConfigMap // as last read or written: the next update's base
}

func (l *recordLock) String() string { return LeaseNamespace + "/" + l.name }

// get reads the record, and its annotation as read (the elector compares
// it with the last one to see a change).
func (l *recordLock) get(ctx context.Context) (electionRecord, []byte, error) {
	cm, err := l.cms.Get(ctx, l.name, metav1.GetOptions{})
	if err != nil {
		return electionRecord{}, nil, err
	}
	l.cm = cm
	rec, raw, err := decodeRecord(cm)
	if err != nil {
		return electionRecord{}, nil, fmt.Errorf("election record %s: %w", l, err)
	}
	return rec, raw, nil
}

// decodeRecord is cm's record; a ConfigMap without the annotation holds
// an empty one.
func decodeRecord(cm *corev1.ConfigMap) (electionRecord, []byte, error) {
	raw := []byte(cm.Annotations[electionAnnotation])
	var rec electionRecord
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &rec); err != nil {
			return electionRecord{}, nil, err
		}
	}
	return rec, raw, nil
}

func (l *recordLock) create(ctx context.Context, rec electionRecord) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	cm, err := l.cms.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: l.name, Namespace: LeaseNamespace,
			Annotations: map[string]string{electionAnnotation: string(raw)}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	l.cm = cm
	return nil
}

// update writes rec on the ConfigMap as last read or written.
func (l *recordLock) update(ctx context.Context, rec electionRecord) error {
	if l.cm == nil {
		return errors.New("election record not read before update")
	}
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	cm := l.cm.DeepCopy()
	if cm.Annotations == nil {
		cm.Annotations = map[string]string{}
	}
	cm.Annotations[electionAnnotation] = string(raw)
	// The update carries the read's resourceVersion: a concurrent
	// writer makes it fail with a conflict, as a Lease update would.
	cm, err = l.cms.Update(ctx, cm, metav1.UpdateOptions{})
	if err != nil {
		return err
	}
	l.cm = cm
	return nil
}

// Election is a pool's election record as the cloud holds it.
type Election struct {
	Holder  string
	Renewed time.Time
	Expires time.Time
}

// ReadElection reads pool's election record from cms, the ConfigMaps of
// LeaseNamespace (the gateway checks it before it writes a delegated
// heartbeat). A pool without a record, or whose record names no holder,
// is an error that apierrors.IsNotFound recognises.
func ReadElection(ctx context.Context, cms ConfigMapGetter, pool string) (Election, error) {
	name := LeaseName(pool)
	cm, err := cms.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return Election{}, err
	}
	rec, _, err := decodeRecord(cm)
	if err != nil {
		return Election{}, fmt.Errorf("election record %s/%s: %w", LeaseNamespace, name, err)
	}
	if rec.HolderIdentity == "" {
		return Election{}, apierrors.NewNotFound(corev1.Resource("configmaps"), name)
	}
	return Election{Holder: rec.HolderIdentity, Renewed: rec.RenewTime.Time,
		Expires: rec.RenewTime.Add(time.Duration(rec.LeaseDurationSeconds) * time.Second)}, nil
}
