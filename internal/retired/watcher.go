package retired

import (
	"context"
	"crypto/x509"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Watcher keeps the retired set from the cloud, with an informer on the
// one ConfigMap.
type Watcher struct {
	informer cache.SharedIndexInformer
	log      *slog.Logger
	set      atomic.Pointer[Set]

	mu       sync.Mutex
	onChange []func()
}

// NewWatcher makes a Watcher; Run starts it. A nil log discards.
func NewWatcher(client kubernetes.Interface, resync time.Duration, log *slog.Logger) *Watcher {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{
		informer: coreinformers.NewFilteredConfigMapInformer(client, Namespace, resync, cache.Indexers{}, func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", ConfigMap).String()
		}),
		log: log,
	}
	empty := Set{}
	w.set.Store(&empty)
	w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.update(obj) },
		UpdateFunc: func(_, obj any) { w.update(obj) },
		DeleteFunc: func(any) { w.update(nil) },
	})
	return w
}

// OnChange adds f, called (from the informer's goroutine) after each
// change of the set. Add before Run.
func (w *Watcher) OnChange(f func()) {
	w.mu.Lock()
	w.onChange = append(w.onChange, f)
	w.mu.Unlock()
}

// Run runs the informer until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	w.informer.Run(ctx.Done())
	return nil
}

// HasSynced reports whether the set was read once.
func (w *Watcher) HasSynced() bool { return w.informer.HasSynced() }

// Set is the retired set of the moment; it must not be changed.
func (w *Watcher) Set() Set { return *w.set.Load() }

// Retired reports whether cert, a certificate of node, is retired.
func (w *Watcher) Retired(node string, cert *x509.Certificate) bool {
	return w.Set().Retires(node, cert)
}

func (w *Watcher) update(obj any) {
	cm, _ := obj.(*corev1.ConfigMap)
	s, err := FromConfigMap(cm)
	if err != nil {
		w.log.Warn("retired nodes: a record does not parse", "err", err)
	}
	w.set.Store(&s)
	w.log.Info("retired nodes read", "nodes", len(s))
	w.mu.Lock()
	fs := w.onChange
	w.mu.Unlock()
	for _, f := range fs {
		f()
	}
}
