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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// The election record lives in a ConfigMap, not a Lease: kube-apiserver's
// NodeRestriction admission lets a node identity write no Lease but its
// own in kube-node-lease, whatever RBAC grants, and the pool's nodes
// campaign with their node identities. A ConfigMap in LeaseNamespace with
// client-go's leader record annotation (the format of client-go's former
// ConfigMap lock) is what RBAC can grant them.

// configMapLock is a resourcelock.Interface on the ConfigMap
// LeaseNamespace/LeaseName(pool).
type configMapLock struct {
	client   kubernetes.Interface
	name     string
	identity string
	cm       *corev1.ConfigMap
}

var _ resourcelock.Interface = (*configMapLock)(nil)

func (l *configMapLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	cm, err := l.client.CoreV1().ConfigMaps(LeaseNamespace).Get(ctx, l.name, metav1.GetOptions{})
	if err != nil {
		return nil, nil, err
	}
	l.cm = cm
	raw := cm.Annotations[resourcelock.LeaderElectionRecordAnnotationKey]
	var rec resourcelock.LeaderElectionRecord
	if raw != "" {
		if err := json.Unmarshal([]byte(raw), &rec); err != nil {
			return nil, nil, fmt.Errorf("election record of %s: %w", l.Describe(), err)
		}
	}
	return &rec, []byte(raw), nil
}

func (l *configMapLock) Create(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	l.cm, err = l.client.CoreV1().ConfigMaps(LeaseNamespace).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: l.name, Namespace: LeaseNamespace,
			Annotations: map[string]string{resourcelock.LeaderElectionRecordAnnotationKey: string(raw)}},
	}, metav1.CreateOptions{})
	return err
}

func (l *configMapLock) Update(ctx context.Context, rec resourcelock.LeaderElectionRecord) error {
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
	cm.Annotations[resourcelock.LeaderElectionRecordAnnotationKey] = string(raw)
	// The update carries the read's resourceVersion: a concurrent
	// writer makes it fail with a conflict, as a Lease update would.
	l.cm, err = l.client.CoreV1().ConfigMaps(LeaseNamespace).Update(ctx, cm, metav1.UpdateOptions{})
	return err
}

func (l *configMapLock) RecordEvent(string) {}
func (l *configMapLock) Identity() string   { return l.identity }
func (l *configMapLock) Describe() string   { return LeaseNamespace + "/" + l.name }

// Election is a pool's election record as the cloud holds it.
type Election struct {
	Holder  string
	Renewed time.Time
	Expires time.Time
}

// ReadElection reads pool's election record (the gateway checks it before
// it writes a delegated heartbeat). A pool without a record is an error
// that apierrors.IsNotFound recognises.
func ReadElection(ctx context.Context, client kubernetes.Interface, pool string) (Election, error) {
	l := &configMapLock{client: client, name: LeaseName(pool)}
	rec, _, err := l.Get(ctx)
	if err != nil {
		return Election{}, err
	}
	if rec.HolderIdentity == "" {
		return Election{}, apierrors.NewNotFound(corev1.Resource("configmaps"), l.name)
	}
	return Election{Holder: rec.HolderIdentity, Renewed: rec.RenewTime.Time,
		Expires: rec.RenewTime.Add(time.Duration(rec.LeaseDurationSeconds) * time.Second)}, nil
}
