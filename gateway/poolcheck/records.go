package poolcheck

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/poolstore/record"
)

// ErrRecordsNotSynced is RecordCache's answer before its informer has
// synced: Checker.Leader turns it into tunnel.Unavailable.
var ErrRecordsNotSynced = errors.New("election record informer not synced yet")

// RecordCache serves the ConfigMaps of record.Namespace, where the
// election records are, from an informer: Checker.Leader costs no GET. It
// is a record.ConfigMapGetter; its objects are trimmed to what
// record.ReadLeader reads (name, version, the election annotation),
// so they may not be the base of a write.
//
// The namespace is watched whole: the records carry no label, and a field
// selector cannot select a name prefix. Tether keeps no other ConfigMaps
// there; any other (kube-root-ca.crt) is held as its name only.
type RecordCache struct {
	client kubernetes.Interface
	resync time.Duration
	log    *slog.Logger

	store  atomic.Pointer[cache.Indexer] // set by Run
	synced atomic.Bool
	done   chan struct{} // closed once synced
	ran    atomic.Bool
}

var _ record.ConfigMapGetter = (*RecordCache)(nil)

// NewRecordCache returns a RecordCache reading with client; call Run to
// start it. resync is the informer's resync period (0: none); log nil
// discards.
func NewRecordCache(client kubernetes.Interface, resync time.Duration, log *slog.Logger) *RecordCache {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &RecordCache{client: client, resync: resync, log: log, done: make(chan struct{})}
}

// Run runs the informer until ctx is done, then returns nil. It may be
// called once.
func (c *RecordCache) Run(ctx context.Context) error {
	if c.ran.Swap(true) {
		return errors.New("poolcheck: RecordCache.Run called twice")
	}
	inf := coreinformers.NewConfigMapInformer(c.client, record.Namespace, c.resync, cache.Indexers{})
	if err := inf.SetTransform(trimRecord); err != nil {
		return fmt.Errorf("set election record transform: %w", err)
	}
	store := inf.GetIndexer()
	c.store.Store(&store)
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		inf.RunWithContext(ctx)
	}()
	c.log.Info("watching election records", "namespace", record.Namespace)
	if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		c.synced.Store(true)
		close(c.done)
		c.log.Info("election record informer synced")
	}
	<-ran
	return nil
}

// WaitSynced blocks until the informer has synced or ctx is done.
func (c *RecordCache) WaitSynced(ctx context.Context) error {
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Ready is nil once the informer has synced, for the gateway's readiness.
func (c *RecordCache) Ready() error {
	if !c.synced.Load() {
		return ErrRecordsNotSynced
	}
	return nil
}

// Get implements record.ConfigMapGetter from the informer's store: a
// NotFound error when there is no such ConfigMap, ErrRecordsNotSynced
// before the informer has synced. The object is the store's trimmed copy
// (see RecordCache); the caller must not change it.
func (c *RecordCache) Get(_ context.Context, name string, _ metav1.GetOptions) (*corev1.ConfigMap, error) {
	if !c.synced.Load() {
		return nil, ErrRecordsNotSynced
	}
	obj, ok, err := (*c.store.Load()).GetByKey(record.Namespace + "/" + name)
	if err != nil {
		return nil, fmt.Errorf("election record cache: %w", err)
	}
	if !ok {
		return nil, apierrors.NewNotFound(corev1.Resource("configmaps"), name)
	}
	return obj.(*corev1.ConfigMap), nil
}

// trimRecord keeps what record.ReadLeader reads, so that the cache
// holds no data, labels or managed fields.
func trimRecord(obj any) (any, error) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return obj, nil // a DeletedFinalStateUnknown tombstone
	}
	out := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{
		Name:            cm.Name,
		Namespace:       cm.Namespace,
		UID:             cm.UID,
		ResourceVersion: cm.ResourceVersion,
	}}
	if rec, ok := cm.Annotations[record.ElectionAnnotation]; ok {
		out.Annotations = map[string]string{record.ElectionAnnotation: rec}
	}
	return out, nil
}
