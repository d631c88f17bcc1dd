package filter

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/internal/kube"
)

// Change says what a change of filter state affects.
type Change struct {
	// Namespace and Service name the Service whose annotation changed;
	// empty when Pools is set.
	Namespace, Service string
	// Pools is set when a node's pool changed: every object whose Service
	// has a nodepool or zone key may filter differently.
	Pools bool
}

// Informers is the real ServiceLookup and NodePools: Service and Node
// informers (through the node's credentials), with change notifications.
type Informers struct {
	informers []cache.SharedIndexInformer
	running   sync.WaitGroup
	services  listersv1.ServiceLister
	nodes     listersv1.NodeLister
	synced    []cache.InformerSynced

	mu   sync.Mutex
	subs map[chan Change]struct{}
}

var (
	_ ServiceLookup = (*Informers)(nil)
	_ NodePools     = (*Informers)(nil)
)

// NewInformers builds the informers; Start runs them.
func NewInformers(client *kube.Client) *Informers {
	svc := cache.NewSharedIndexInformer(kube.ListWatch(client.Services("")), &corev1.Service{}, 0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	nodes := cache.NewSharedIndexInformer(kube.ListWatch(client.Nodes()), &corev1.Node{}, 0, cache.Indexers{})
	in := &Informers{informers: []cache.SharedIndexInformer{svc, nodes},
		services: listersv1.NewServiceLister(svc.GetIndexer()), nodes: listersv1.NewNodeLister(nodes.GetIndexer()),
		synced: []cache.InformerSynced{svc.HasSynced, nodes.HasSynced},
		subs:   map[chan Change]struct{}{}}
	svc.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(o, n any) {
			os, ok1 := o.(*corev1.Service)
			ns, ok2 := n.(*corev1.Service)
			if ok1 && ok2 && os.Annotations[AnnotationTopologyKeys] != ns.Annotations[AnnotationTopologyKeys] {
				in.notify(Change{Namespace: ns.Namespace, Service: ns.Name})
			}
		},
		AddFunc: func(o any) {
			if s, ok := o.(*corev1.Service); ok && in.HasSynced() && s.Annotations[AnnotationTopologyKeys] != "" {
				in.notify(Change{Namespace: s.Namespace, Service: s.Name})
			}
		},
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if s, ok := o.(*corev1.Service); ok && s.Annotations[AnnotationTopologyKeys] != "" {
				in.notify(Change{Namespace: s.Namespace, Service: s.Name})
			}
		},
	})
	nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if n, ok := o.(*corev1.Node); ok && in.HasSynced() && n.Labels[LabelNodePool] != "" {
				in.notify(Change{Pools: true})
			}
		},
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*corev1.Node)
			nn, ok2 := n.(*corev1.Node)
			if ok1 && ok2 && on.Labels[LabelNodePool] != nn.Labels[LabelNodePool] {
				in.notify(Change{Pools: true})
			}
		},
		DeleteFunc: func(o any) { in.notify(Change{Pools: true}) },
	})
	return in
}

// Start runs the informers until ctx ends.
func (in *Informers) Start(ctx context.Context) {
	for _, i := range in.informers {
		in.running.Go(func() { i.RunWithContext(ctx) })
	}
}

// Shutdown waits for the informers to stop (after ctx of Start ended).
func (in *Informers) Shutdown() { in.running.Wait() }

// HasSynced reports whether both informers have synced.
func (in *Informers) HasSynced() bool {
	for _, s := range in.synced {
		if !s() {
			return false
		}
	}
	return true
}

// WaitSynced waits up to d for HasSynced.
func (in *Informers) WaitSynced(ctx context.Context, d time.Duration) bool {
	if in.HasSynced() {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return cache.WaitForCacheSync(ctx.Done(), in.synced...)
}

// TopologyKeys implements ServiceLookup.
func (in *Informers) TopologyKeys(namespace, name string) (string, bool) {
	s, err := in.services.Services(namespace).Get(name)
	if err != nil {
		return "", false
	}
	v, ok := s.Annotations[AnnotationTopologyKeys]
	return v, ok && v != ""
}

// PoolOf implements NodePools.
func (in *Informers) PoolOf(node string) string {
	n, err := in.nodes.Get(node)
	if err != nil {
		return ""
	}
	return n.Labels[LabelNodePool]
}

// Subscribe returns a channel of changes (buffered; when full, a change
// coalesces into a pool change, which covers everything) and a function
// that ends the subscription.
func (in *Informers) Subscribe() (<-chan Change, func()) {
	ch := make(chan Change, 64)
	in.mu.Lock()
	in.subs[ch] = struct{}{}
	in.mu.Unlock()
	return ch, func() {
		in.mu.Lock()
		delete(in.subs, ch)
		in.mu.Unlock()
	}
}

func (in *Informers) notify(c Change) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for ch := range in.subs {
		select {
		case ch <- c:
		default:
			// Full: make sure a catch-all change is pending.
			select {
			case <-ch:
			default:
			}
			select {
			case ch <- Change{Pools: true}:
			default:
			}
		}
	}
}

// Filter is the topology filter of one node on its informers.
type Filter struct {
	Topology
	*Informers
}

// New builds the filter of node; client reaches the cloud as the node.
// Start runs its informers.
func New(node string, client *kube.Client) *Filter {
	in := NewInformers(client)
	return &Filter{Topology: Topology{Node: node, Services: in, Pools: in}, Informers: in}
}
