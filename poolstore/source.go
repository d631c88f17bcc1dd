package poolstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/localapi"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/poolstore/replica"
)

//lint:file-ignore SA1019 core/v1 Endpoints is deprecated but still served and read by older clients; the pool shares it.

// DefaultResources are the pool-scope resources shared by default.
var DefaultResources = []schema.GroupVersionResource{
	discoveryv1.SchemeGroupVersion.WithResource("endpointslices"),
	corev1.SchemeGroupVersion.WithResource("endpoints"),
	corev1.SchemeGroupVersion.WithResource("services"),
}

// SyncInterval is how often the leader marks its watches synced (in its
// store, hence in the replication stream, and in the sync Lease) while
// they are.
const SyncInterval = 10 * time.Second

// SourceOptions configure a Source.
type SourceOptions struct {
	// Client reads the known resources (in protobuf: the cheapest on the
	// uplink) and the sync record; Dynamic reads the others.
	Client  *kube.Client
	Dynamic dynamic.Interface
	// Records writes the sync record on this node's behalf, as it does the
	// election record (elect.Options.Records); nil: Client writes it.
	Records   record.Writer
	Resources []schema.GroupVersionResource
	Store     *replica.Store
	Pool      string
	Node      string
	Logger    *slog.Logger
}

// Source is the leader's list/watch of the pool-scope resources from the
// cloud into its store.
type Source struct {
	o SourceOptions

	mu     sync.Mutex
	synced map[string]bool
}

// NewSource returns a Source; Run runs it.
func NewSource(o SourceOptions) *Source {
	if len(o.Resources) == 0 {
		o.Resources = DefaultResources
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return &Source{o: o, synced: map[string]bool{}}
}

// Run list/watches every resource until ctx ends (the leader's term).
func (s *Source) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, gvr := range s.o.Resources {
		lw, err := s.listWatcher(gvr)
		if err != nil {
			s.o.Logger.Error("pool resource not shared", "resource", replica.ResourceKey(gvr), "err", err)
			continue
		}
		wg.Go(func() { s.run(ctx, replica.ResourceKey(gvr), lw) })
	}
	wg.Go(func() { s.markSynced(ctx) })
	wg.Wait()
}

// Synced reports whether every resource is listed and watched.
func (s *Source) Synced() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, gvr := range s.o.Resources {
		if !s.synced[replica.ResourceKey(gvr)] {
			return false
		}
	}
	return true
}

func (s *Source) setSynced(resource string, v bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.synced[resource] = v
}

// markSynced marks the store synced, and renews the sync Lease, every
// SyncInterval while all watches are synced (at once when they become
// so).
func (s *Source) markSynced(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !s.Synced() || time.Since(last) < SyncInterval {
			continue
		}
		last = time.Now()
		s.o.Store.MarkSynced(last)
		if err := s.renewSyncLease(ctx, last); err != nil && ctx.Err() == nil {
			s.o.Logger.Warn("pool sync lease not renewed", "err", err)
		}
	}
}

// renewSyncLease writes the leader-informer-sync record,
// record.Namespace/record.SyncName(pool): a ConfigMap (see lock.go) naming this
// node and the time its watches were last seen synced. It is read with
// Client and written with Records, as the election record is.
func (s *Source) renewSyncLease(ctx context.Context, now time.Time) error {
	cms := s.o.Client.ConfigMaps(record.Namespace)
	w := s.o.Records
	if w == nil {
		w = record.ClientWriter{ConfigMaps: cms}
	}
	name := record.SyncName(s.o.Pool)
	data := record.Sync{HolderIdentity: s.o.Node, RenewTime: now, LeaseDurationSeconds: record.SyncLeaseSeconds}.Data()
	cm, err := cms.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: record.Namespace}, Data: data}
		_, err = w.WriteRecord(ctx, record.Write{Kind: record.KindSync, Pool: s.o.Pool, Create: true, ConfigMap: cm})
		return err
	}
	if err != nil {
		return err
	}
	cm.Data = data
	_, err = w.WriteRecord(ctx, record.Write{Kind: record.KindSync, Pool: s.o.Pool, ConfigMap: cm})
	return err
}

// listWatcher reads one resource: items and events as JSON with kind and
// apiVersion set.
type listWatcher struct {
	gvk   schema.GroupVersionKind
	list  func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error)
	watch func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error)
}

func (s *Source) listWatcher(gvr schema.GroupVersionResource) (listWatcher, error) {
	c := s.o.Client
	switch gvr {
	case DefaultResources[0]:
		i := c.EndpointSlices("")
		return listWatcher{discoveryv1.SchemeGroupVersion.WithKind("EndpointSlice"),
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return i.List(ctx, o) }, i.Watch}, nil
	case DefaultResources[1]:
		i := c.Endpoints("")
		return listWatcher{corev1.SchemeGroupVersion.WithKind("Endpoints"),
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return i.List(ctx, o) }, i.Watch}, nil
	case DefaultResources[2]:
		i := c.Services("")
		return listWatcher{corev1.SchemeGroupVersion.WithKind("Service"),
			func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return i.List(ctx, o) }, i.Watch}, nil
	}
	if s.o.Dynamic == nil {
		return listWatcher{}, errors.New("no dynamic client for it")
	}
	i := s.o.Dynamic.Resource(gvr)
	return listWatcher{schema.GroupVersionKind{}, // unstructured objects carry theirs
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return i.List(ctx, o) }, i.Watch}, nil
}

// encode returns obj's JSON with kind and apiVersion set.
func (lw listWatcher) encode(obj runtime.Object) (json.RawMessage, error) {
	if !lw.gvk.Empty() {
		obj.GetObjectKind().SetGroupVersionKind(lw.gvk)
	}
	return json.Marshal(obj)
}

// run lists and watches one resource until ctx ends, relisting when the
// watch's resourceVersion is too old, retrying with backoff while the
// cloud does not answer.
func (s *Source) run(ctx context.Context, resource string, lw listWatcher) {
	log := s.o.Logger.With("resource", resource)
	backoff := time.Second
	for ctx.Err() == nil {
		rv, err := s.list(ctx, resource, lw)
		for err == nil {
			backoff = time.Second
			rv, err = s.watch(ctx, resource, lw, rv)
		}
		s.setSynced(resource, false)
		if ctx.Err() != nil {
			return
		}
		if !errors.Is(err, errRelist) {
			log.Debug("pool resource list/watch failed; retrying", "err", err, "in", backoff)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff + rand.N(backoff/2)):
			}
			backoff = min(2*backoff, 30*time.Second)
		}
	}
}

var errRelist = errors.New("watch expired: relist")

func (s *Source) list(ctx context.Context, resource string, lw listWatcher) (string, error) {
	obj, err := lw.list(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("list: %w", err)
	}
	items, err := meta.ExtractList(obj)
	if err != nil {
		return "", fmt.Errorf("list: %w", err)
	}
	raws := make([]json.RawMessage, 0, len(items))
	for _, it := range items {
		raw, err := lw.encode(it)
		if err != nil {
			return "", fmt.Errorf("list: %w", err)
		}
		raws = append(raws, raw)
	}
	lm, err := meta.ListAccessor(obj)
	if err != nil {
		return "", fmt.Errorf("list: %w", err)
	}
	rv := lm.GetResourceVersion()
	if err := s.o.Store.Replace(resource, raws, localapi.ParseRV(rv)); err != nil {
		return "", err
	}
	s.setSynced(resource, true)
	return rv, nil
}

// watch applies events from rv until the watch ends; it returns the last
// resourceVersion seen, errRelist when the apiserver says it is too old.
func (s *Source) watch(ctx context.Context, resource string, lw listWatcher, rv string) (string, error) {
	timeout := int64(300 + rand.N(300))
	w, err := lw.watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true, TimeoutSeconds: &timeout})
	if err != nil {
		if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
			return rv, errRelist
		}
		return rv, fmt.Errorf("watch: %w", err)
	}
	defer w.Stop()
	for {
		var ev watch.Event
		var ok bool
		select {
		case <-ctx.Done():
			return rv, ctx.Err()
		case ev, ok = <-w.ResultChan():
		}
		if !ok {
			return rv, nil // ended (timeout): watch again from rv
		}
		if ev.Type == watch.Error {
			if st := apierrors.FromObject(ev.Object); apierrors.IsResourceExpired(st) || apierrors.IsGone(st) {
				return rv, errRelist
			}
			return rv, fmt.Errorf("watch: %v", apierrors.FromObject(ev.Object))
		}
		raw, err := lw.encode(ev.Object)
		if err != nil {
			return rv, fmt.Errorf("watch: %w", err)
		}
		if err := s.o.Store.Apply(resource, string(ev.Type), raw); err != nil {
			return rv, err
		}
		if m, err := meta.Accessor(ev.Object); err == nil {
			rv = m.GetResourceVersion()
		}
	}
}
