package poolstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/kube"
)

// The election record lives in a ConfigMap, not a Lease: kube-apiserver's
// NodeRestriction admission lets a node identity write no Lease but its
// own in kube-node-lease, whatever RBAC grants. A ConfigMap in
// RecordNamespace with client-go's leader record annotation (the format of
// client-go's former ConfigMap lock) is what RBAC can grant.
//
// Nodes only read it, though: RBAC cannot tell one pool's record from
// another's, nor admission the requesting node's pool, so a node allowed
// to write ConfigMaps in RecordNamespace could write every pool's. The
// records are written on the node's behalf by a RecordWriter: in
// tether-edge the gateway, through the tunnel, after checking that the
// node is in the pool and that the record names it (gateway/election).

// ElectionAnnotation is the ConfigMap annotation that holds the election
// record (client-go's resourcelock.LeaderElectionRecordAnnotationKey).
const ElectionAnnotation = "control-plane.alpha.kubernetes.io/leader"

// ElectionRecord is client-go's resourcelock.LeaderElectionRecord with
// the same JSON names and types, so that records written by client-go's
// leader election (which earlier versions of tether-edge ran) and by this
// package read alike. client-go's fields for coordinated leader election,
// strategy and preferredHolder, are not written; client-go reads them as
// empty.
type ElectionRecord struct {
	// HolderIdentity is the node that holds the record; "" when none
	// does (released): any candidate may take it at once.
	HolderIdentity       string      `json:"holderIdentity"`
	LeaseDurationSeconds int         `json:"leaseDurationSeconds"`
	AcquireTime          metav1.Time `json:"acquireTime"`
	RenewTime            metav1.Time `json:"renewTime"`
	LeaderTransitions    int         `json:"leaderTransitions"`
}

// DecodeElectionRecord is cm's election record (its ElectionAnnotation);
// a ConfigMap without the annotation holds an empty one.
func DecodeElectionRecord(cm *corev1.ConfigMap) (ElectionRecord, error) {
	rec, _, err := decodeRecord(cm)
	return rec, err
}

// SetElectionRecord writes rec into cm's ElectionAnnotation.
func SetElectionRecord(cm *corev1.ConfigMap, rec ElectionRecord) error {
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

// SyncRecord is the leader-informer-sync record,
// RecordNamespace/SyncRecordName(pool): a ConfigMap whose data names the
// leader and when its watches were last seen synced.
type SyncRecord struct {
	HolderIdentity       string    // data holderIdentity
	RenewTime            time.Time // data renewTime, RFC 3339 with nanoseconds
	LeaseDurationSeconds int       // data leaseDurationSeconds
}

// Data is the record as the ConfigMap's data.
func (r SyncRecord) Data() map[string]string {
	return map[string]string{"holderIdentity": r.HolderIdentity, "renewTime": r.RenewTime.UTC().Format(time.RFC3339Nano),
		"leaseDurationSeconds": strconv.Itoa(r.LeaseDurationSeconds)}
}

// DecodeSyncRecord is cm's sync record; every key must be there.
func DecodeSyncRecord(cm *corev1.ConfigMap) (SyncRecord, error) {
	d := cm.Data
	for _, k := range []string{"holderIdentity", "renewTime", "leaseDurationSeconds"} {
		if _, ok := d[k]; !ok {
			return SyncRecord{}, fmt.Errorf("sync record without %s", k)
		}
	}
	renew, err := time.Parse(time.RFC3339Nano, d["renewTime"])
	if err != nil {
		return SyncRecord{}, fmt.Errorf("sync record renewTime: %w", err)
	}
	secs, err := strconv.Atoi(d["leaseDurationSeconds"])
	if err != nil {
		return SyncRecord{}, fmt.Errorf("sync record leaseDurationSeconds: %w", err)
	}
	return SyncRecord{HolderIdentity: d["holderIdentity"], RenewTime: renew, LeaseDurationSeconds: secs}, nil
}

// RecordKind says which of its pool's records a write is for.
type RecordKind uint8

// The records of a pool, both ConfigMaps in RecordNamespace.
const (
	RecordElection RecordKind = 1 // ElectionRecordName(pool): who leads
	RecordSync     RecordKind = 2 // SyncRecordName(pool): the leader's sync mark
)

// RecordWrite is one write of a pool's record.
type RecordWrite struct {
	Kind RecordKind
	Pool string
	// Create asks to create ConfigMap, which does not exist; otherwise it
	// is updated from its ResourceVersion, which must be the stored one.
	Create    bool
	ConfigMap *corev1.ConfigMap
}

// RecordWriter writes a pool's records on this node's behalf and returns
// them as stored. Errors are the apiserver's where it answered (a changed
// record is a conflict, apierrors.IsConflict); the elector treats any
// error as a failed try.
type RecordWriter interface {
	WriteRecord(ctx context.Context, w RecordWrite) (*corev1.ConfigMap, error)
}

// ConfigMapGetter reads the ConfigMaps of RecordNamespace: the
// clientset's CoreV1().ConfigMaps(RecordNamespace) or kube's
// ConfigMaps(RecordNamespace).
type ConfigMapGetter interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.ConfigMap, error)
}

// ConfigMapWriter writes the ConfigMaps of RecordNamespace, as
// ConfigMapGetter reads them.
type ConfigMapWriter interface {
	Create(ctx context.Context, cm *corev1.ConfigMap, opts metav1.CreateOptions) (*corev1.ConfigMap, error)
	Update(ctx context.Context, cm *corev1.ConfigMap, opts metav1.UpdateOptions) (*corev1.ConfigMap, error)
}

var (
	_ ConfigMapGetter = (*kube.ConfigMaps)(nil)
	_ ConfigMapWriter = (*kube.ConfigMaps)(nil)
)

// ClientRecords is a RecordWriter that writes with a client of its own,
// whose identity RBAC must let write ConfigMaps in RecordNamespace: an
// administrator's or the gateway's, not a node's (the shipped
// pool-rbac.yaml lets nodes only read them).
type ClientRecords struct{ ConfigMaps ConfigMapWriter }

var _ RecordWriter = ClientRecords{}

// WriteRecord implements RecordWriter.
func (c ClientRecords) WriteRecord(ctx context.Context, w RecordWrite) (*corev1.ConfigMap, error) {
	if w.Create {
		return c.ConfigMaps.Create(ctx, w.ConfigMap, metav1.CreateOptions{})
	}
	return c.ConfigMaps.Update(ctx, w.ConfigMap, metav1.UpdateOptions{})
}

// recordLock reads the election record in the ConfigMap
// RecordNamespace/ElectionRecordName(pool) and has it written.
type recordLock struct {
	get  ConfigMapGetter
	w    RecordWriter
	pool string
	name string
	cm   *corev1.ConfigMap // as last read or written: the next update's base
}

func (l *recordLock) String() string { return RecordNamespace + "/" + l.name }

// read reads the record, and its annotation as read (the elector compares
// it with the last one to see a change).
func (l *recordLock) read(ctx context.Context) (ElectionRecord, []byte, error) {
	cm, err := l.get.Get(ctx, l.name, metav1.GetOptions{})
	if err != nil {
		return ElectionRecord{}, nil, err
	}
	l.cm = cm
	rec, raw, err := decodeRecord(cm)
	if err != nil {
		return ElectionRecord{}, nil, fmt.Errorf("election record %s: %w", l, err)
	}
	return rec, raw, nil
}

// decodeRecord is cm's record; a ConfigMap without the annotation holds
// an empty one.
func decodeRecord(cm *corev1.ConfigMap) (ElectionRecord, []byte, error) {
	raw := []byte(cm.Annotations[ElectionAnnotation])
	var rec ElectionRecord
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &rec); err != nil {
			return ElectionRecord{}, nil, err
		}
	}
	return rec, raw, nil
}

func (l *recordLock) create(ctx context.Context, rec ElectionRecord) error {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: l.name, Namespace: RecordNamespace}}
	if err := SetElectionRecord(cm, rec); err != nil {
		return err
	}
	cm, err := l.w.WriteRecord(ctx, RecordWrite{Kind: RecordElection, Pool: l.pool, Create: true, ConfigMap: cm})
	if err != nil {
		return err
	}
	l.cm = cm
	return nil
}

// update writes rec on the ConfigMap as last read or written.
func (l *recordLock) update(ctx context.Context, rec ElectionRecord) error {
	if l.cm == nil {
		return errors.New("election record not read before update")
	}
	cm := l.cm.DeepCopy()
	if err := SetElectionRecord(cm, rec); err != nil {
		return err
	}
	// The update carries the read's resourceVersion: a concurrent
	// writer makes it fail with a conflict, as a Lease update would.
	cm, err := l.w.WriteRecord(ctx, RecordWrite{Kind: RecordElection, Pool: l.pool, ConfigMap: cm})
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
// RecordNamespace (the gateway checks it before it writes a delegated
// heartbeat). A pool without a record, or whose record names no holder,
// is an error that apierrors.IsNotFound recognises.
func ReadElection(ctx context.Context, cms ConfigMapGetter, pool string) (Election, error) {
	name := ElectionRecordName(pool)
	cm, err := cms.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return Election{}, err
	}
	rec, _, err := decodeRecord(cm)
	if err != nil {
		return Election{}, fmt.Errorf("election record %s/%s: %w", RecordNamespace, name, err)
	}
	if rec.HolderIdentity == "" {
		return Election{}, apierrors.NewNotFound(corev1.Resource("configmaps"), name)
	}
	return Election{Holder: rec.HolderIdentity, Renewed: rec.RenewTime.Time,
		Expires: rec.RenewTime.Add(time.Duration(rec.LeaseDurationSeconds) * time.Second)}, nil
}
