// Package topology is tether-gateway's update-trigger controller
// (--enable-update-trigger), for clusters whose edges still run YurtHub:
// YurtHub filters EndpointSlices and Endpoints by the Service's
// openyurt.io/topologyKeys only when they change, so the controller
// changes them (annotation openyurt.io/update-trigger, unix seconds)
// when what the filter depends on changes:
//
//   - a Service's openyurt.io/topologyKeys changes: all its EndpointSlices
//     (label kubernetes.io/service-name) and its Endpoints;
//   - a Node's apps.openyurt.io/nodepool label is added, changed or
//     removed: the EndpointSlices and Endpoints of Services whose keys
//     name openyurt.io/nodepool or kubernetes.io/zone and that have an
//     endpoint on a node of the old or the new pool (the node itself
//     counts as a member of both).
//
// tether-edge needs none of this: it re-sends affected objects on its own
// (edgeproxy/filter).
package topology

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	discoverylisters "k8s.io/client-go/listers/discovery/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/internal/openyurt"
)

// Controller stamps openyurt.io/update-trigger on affected endpoints.
type Controller struct {
	client   kubernetes.Interface
	factory  informers.SharedInformerFactory
	services listersv1.ServiceLister
	nodes    listersv1.NodeLister
	slices   discoverylisters.EndpointSliceLister
	eps      listersv1.EndpointsLister
	synced   []cache.InformerSynced
	queue    workqueue.TypedRateLimitingInterface[types.NamespacedName] // Services to touch
	clock    clock.Clock
	log      *slog.Logger
}

// Options configure New.
type Options struct {
	Logger *slog.Logger
	Clock  clock.Clock
}

// New builds the controller; Run runs it.
func New(client kubernetes.Interface, o Options) *Controller {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	f := informers.NewSharedInformerFactory(client, 0)
	c := &Controller{client: client, factory: f, clock: o.Clock, log: o.Logger,
		services: f.Core().V1().Services().Lister(), nodes: f.Core().V1().Nodes().Lister(),
		slices: f.Discovery().V1().EndpointSlices().Lister(), eps: f.Core().V1().Endpoints().Lister(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[types.NamespacedName](),
			workqueue.TypedRateLimitingQueueConfig[types.NamespacedName]{Name: "update-trigger"})}
	c.synced = []cache.InformerSynced{f.Core().V1().Services().Informer().HasSynced, f.Core().V1().Nodes().Informer().HasSynced,
		f.Discovery().V1().EndpointSlices().Informer().HasSynced, f.Core().V1().Endpoints().Informer().HasSynced}
	f.Core().V1().Services().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(o, n any) {
			os, ok1 := o.(*corev1.Service)
			ns, ok2 := n.(*corev1.Service)
			if ok1 && ok2 && os.Annotations[openyurt.TopologyKeysAnnotation] != ns.Annotations[openyurt.TopologyKeysAnnotation] {
				c.queue.Add(types.NamespacedName{Namespace: ns.Namespace, Name: ns.Name})
			}
		},
	})
	f.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*corev1.Node)
			nn, ok2 := n.(*corev1.Node)
			if ok1 && ok2 && on.Labels[openyurt.PoolLabel] != nn.Labels[openyurt.PoolLabel] {
				c.poolChanged(nn.Name, on.Labels[openyurt.PoolLabel], nn.Labels[openyurt.PoolLabel])
			}
		},
	})
	return c
}

// Run runs the controller until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	c.factory.Start(ctx.Done())
	defer c.factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return nil
	}
	c.log.Info("update-trigger controller synced")
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	for c.processNext(ctx) {
	}
	return nil
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if err := c.touch(ctx, key); err != nil {
		c.log.Warn("update-trigger", "service", key.String(), "err", err)
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

// poolChanged queues the pool-typed Services with an endpoint on a node
// of the old or new pool of node.
func (c *Controller) poolChanged(node, oldPool, newPool string) {
	members := map[string]bool{node: true}
	nodes, _ := c.nodes.List(labels.Everything())
	for _, n := range nodes {
		if p := n.Labels[openyurt.PoolLabel]; p != "" && (p == oldPool || p == newPool) {
			members[n.Name] = true
		}
	}
	svcs, _ := c.services.List(labels.Everything())
	for _, s := range svcs {
		if !openyurt.IsPoolKey(s.Annotations[openyurt.TopologyKeysAnnotation]) {
			continue
		}
		if c.hasEndpointOn(s, members) {
			c.queue.Add(types.NamespacedName{Namespace: s.Namespace, Name: s.Name})
		}
	}
}

func (c *Controller) hasEndpointOn(s *corev1.Service, members map[string]bool) bool {
	sl, _ := c.slices.EndpointSlices(s.Namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: s.Name}))
	for _, es := range sl {
		for _, e := range es.Endpoints {
			if e.NodeName != nil && members[*e.NodeName] {
				return true
			}
		}
	}
	if ep, err := c.eps.Endpoints(s.Namespace).Get(s.Name); err == nil {
		for _, ss := range ep.Subsets {
			for _, as := range [][]corev1.EndpointAddress{ss.Addresses, ss.NotReadyAddresses} {
				for _, a := range as {
					if a.NodeName != nil && members[*a.NodeName] {
						return true
					}
				}
			}
		}
	}
	return false
}

// touch patches the update trigger on the Service's EndpointSlices and
// Endpoints.
func (c *Controller) touch(ctx context.Context, svc types.NamespacedName) error {
	now := c.clock.Now().Unix()
	// patchFor stamps the current unix second, or one more than the
	// object has if that is not older: a patch that changes nothing would
	// not reach YurtHub.
	patchFor := func(annotations map[string]string) []byte {
		v := now
		if old, err := strconv.ParseInt(annotations[openyurt.UpdateTriggerAnnotation], 10, 64); err == nil && old >= v {
			v = old + 1
		}
		return fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"%d"}}}`, openyurt.UpdateTriggerAnnotation, v)
	}
	sl, err := c.slices.EndpointSlices(svc.Namespace).List(labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: svc.Name}))
	if err != nil {
		return err
	}
	for _, es := range sl {
		if _, err := c.client.DiscoveryV1().EndpointSlices(es.Namespace).Patch(ctx, es.Name, types.MergePatchType, patchFor(es.Annotations), metav1.PatchOptions{}); err != nil && !isNotFound(err) {
			return fmt.Errorf("patch EndpointSlice %s/%s: %w", es.Namespace, es.Name, err)
		}
	}
	if ep, err := c.eps.Endpoints(svc.Namespace).Get(svc.Name); err == nil {
		if _, err := c.client.CoreV1().Endpoints(svc.Namespace).Patch(ctx, svc.Name, types.MergePatchType, patchFor(ep.Annotations), metav1.PatchOptions{}); err != nil && !isNotFound(err) {
			return fmt.Errorf("patch Endpoints %s: %w", svc, err)
		}
	}
	c.log.Debug("update trigger stamped", "service", svc.String(), "slices", len(sl))
	return nil
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
