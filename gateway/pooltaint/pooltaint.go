// Package pooltaint is the gateway's controller of the delegated-heartbeat
// taint: a node whose heartbeats reach the cloud only through its pool's
// leader (its Lease in kube-node-lease carries
// openyurt.io/delegate-heartbeat: "true") gets the taint
// node.openyurt.io/unschedulable=true:NoSchedule, so that no new pod lands
// on a node the cloud cannot reach; the taint goes when the node renews
// its Lease itself again.
//
// Data flow: an informer on the Leases of kube-node-lease (NewLeaseInformer;
// the gateway shares it with the delegated-heartbeat handler, which
// updates from its copies) feeds a streak
// per node, counted on renewals only (a Lease event whose spec.renewTime
// differs from the last one seen, the first one seen included): an
// annotated renewal adds one, an unannotated one resets it to zero. A
// second informer on Nodes, trimmed to their taints, tells which nodes
// carry the taint. Each renewal queues its node; a worker then
//
//   - taints the node when its streak has reached Options.Threshold
//     (default 4) and the Node lacks the taint;
//   - untaints it when its last renewal was unannotated and the Node has
//     the taint (whoever put it there: a restarted gateway starts with no
//     streaks, but still clears stale taints).
//
// A change patches spec.taints with the Node's resourceVersion as a
// precondition, so that a concurrent change of any taint is never lost;
// taints other than this one are left as they are. The first attempt
// starts from the informer's copy (one request); a conflict reads the Node
// with a GET and tries again. Several gateway replicas may run the controller at
// once: they see the same renewals and their changes are idempotent.
//
// Metrics: tether_gateway_delegated_heartbeat_tainted_nodes (Nodes that
// carry the taint, read from the informer at scrape time) and
// tether_gateway_delegated_heartbeat_taint_changes_total{action,result}.
package pooltaint

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coordinationinformers "k8s.io/client-go/informers/coordination/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/client-go/util/workqueue"

	"github.com/tether-edge/tether/internal/openyurt"
)

// DefaultThreshold is how many annotated renewals in a row taint a node.
const DefaultThreshold = 4

// Taint is the taint the controller sets and clears.
var Taint = corev1.Taint{Key: openyurt.UnschedulableTaintKey, Value: "true", Effect: corev1.TaintEffectNoSchedule}

// Options configure New.
type Options struct {
	// Leases is the informer on kube-node-lease, from NewLeaseInformer,
	// that the caller runs (shared with the heartbeat handler); nil means
	// one of the controller's own, run by Run.
	Leases cache.SharedIndexInformer
	// Threshold is how many renewals in a row must carry the annotation
	// before the node is tainted; 0 means DefaultThreshold.
	Threshold int
	// Logger receives taint changes (info) and failures (warn); nil
	// discards.
	Logger *slog.Logger
	// Registerer, if set, gets the controller's metrics.
	Registerer prometheus.Registerer
}

// Controller taints and untaints nodes by their Leases' annotation.
type Controller struct {
	client    kubernetes.Interface
	threshold int
	log       *slog.Logger
	leases    cache.SharedIndexInformer
	ownLeases bool // Run runs leases
	nodes     cache.SharedIndexInformer
	queue     workqueue.TypedRateLimitingInterface[string] // node names
	*metrics

	mu      sync.Mutex
	streaks map[string]*streak // guarded by mu; by node name
}

// streak is what the controller remembers of a node's renewals.
type streak struct {
	renew     metav1.MicroTime // spec.renewTime of the last renewal seen
	annotated bool             // whether that renewal carried the annotation
	n         int              // annotated renewals in a row, up to it
}

// New builds the controller; Run runs it.
func New(client kubernetes.Interface, o Options) (*Controller, error) {
	c := &Controller{
		client:    client,
		threshold: o.Threshold,
		log:       o.Logger,
		leases:    o.Leases,
		nodes:     coreinformers.NewNodeInformer(client, 0, cache.Indexers{}),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "delegated-heartbeat-taint"}),
		streaks: make(map[string]*streak),
	}
	if c.threshold <= 0 {
		c.threshold = DefaultThreshold
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.leases == nil {
		var err error
		if c.leases, err = NewLeaseInformer(client); err != nil {
			return nil, err
		}
		c.ownLeases = true
	}
	if err := c.nodes.SetTransform(trimNode); err != nil {
		return nil, fmt.Errorf("set node transform: %w", err)
	}
	if _, err := c.leases.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.observe,
		UpdateFunc: func(_, obj any) { c.observe(obj) },
		DeleteFunc: c.forget,
	}); err != nil {
		return nil, fmt.Errorf("add lease event handler: %w", err)
	}
	var err error
	if c.metrics, err = newMetrics(o.Registerer, func() float64 { return float64(c.Tainted()) }); err != nil {
		return nil, fmt.Errorf("register taint metrics: %w", err)
	}
	return c, nil
}

// Taint change actions (metric label).
const (
	actionTaint   = "taint"
	actionUntaint = "untaint"
)

// NewLeaseInformer returns an informer on the Leases of kube-node-lease
// whose objects lack only their managedFields: the heartbeat handler
// updates a node Lease from a copy of the informer's (the gateway's RBAC
// has update, not patch), so the rest must be there. A node Lease is a few
// hundred bytes without them.
func NewLeaseInformer(client kubernetes.Interface) (cache.SharedIndexInformer, error) {
	inf := coordinationinformers.NewLeaseInformer(client, corev1.NamespaceNodeLease, 0, cache.Indexers{})
	if err := inf.SetTransform(trimLease); err != nil {
		return nil, fmt.Errorf("set lease transform: %w", err)
	}
	return inf, nil
}

// trimLease drops the managed fields (half of a node Lease's bytes).
func trimLease(obj any) (any, error) {
	if l, ok := obj.(*coordinationv1.Lease); ok {
		l.ManagedFields = nil
	}
	return obj, nil // or a DeletedFinalStateUnknown tombstone
}

// trimNode keeps the taints only.
func trimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, ResourceVersion: n.ResourceVersion},
		Spec:       corev1.NodeSpec{Taints: n.Spec.Taints},
	}, nil
}

// observe counts a renewal of a node's Lease and queues the node.
func (c *Controller) observe(obj any) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok || l.Spec.RenewTime == nil {
		return
	}
	annotated := l.Annotations[openyurt.DelegateHeartbeatAnnotation] == "true"
	c.mu.Lock()
	s := c.streaks[l.Name]
	if s == nil {
		s = &streak{}
		c.streaks[l.Name] = s
	} else if s.renew.Equal(l.Spec.RenewTime) {
		c.mu.Unlock()
		return // not a renewal: a resync, or a change of something else
	}
	s.renew, s.annotated = *l.Spec.RenewTime, annotated
	if annotated {
		s.n++
	} else {
		s.n = 0
	}
	c.mu.Unlock()
	c.queue.Add(l.Name)
}

// forget drops a deleted Lease's streak; its node keeps its taint.
func (c *Controller) forget(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if l, ok := obj.(*coordinationv1.Lease); ok {
		c.mu.Lock()
		delete(c.streaks, l.Name)
		c.mu.Unlock()
	}
}

// Run runs the informers (the Lease informer only if it is the
// controller's own) and the worker until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	var wg sync.WaitGroup
	defer wg.Wait()
	if c.ownLeases {
		wg.Go(func() { c.leases.RunWithContext(ctx) })
	}
	wg.Go(func() { c.nodes.RunWithContext(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), c.HasSynced) {
		return nil
	}
	c.log.Info("delegated-heartbeat taint controller synced", "threshold", c.threshold, "tainted", c.Tainted())
	context.AfterFunc(ctx, c.queue.ShutDown)
	for c.processNext(ctx) {
	}
	return nil
}

func (c *Controller) processNext(ctx context.Context) bool {
	node, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(node)
	if err := c.reconcile(ctx, node); err != nil {
		c.log.Warn("delegated-heartbeat taint", "node", node, "err", err)
		c.queue.AddRateLimited(node)
		return true
	}
	c.queue.Forget(node)
	return true
}

// reconcile taints or untaints node as its streak says (see the package
// doc).
func (c *Controller) reconcile(ctx context.Context, node string) error {
	c.mu.Lock()
	s, ok := c.streaks[node]
	var st streak
	if ok {
		st = *s
	}
	c.mu.Unlock()
	if !ok {
		return nil
	}
	has, known := c.hasTaint(node)
	if !known {
		return nil // no Node (yet): its next renewal comes back here
	}
	switch {
	case st.annotated && st.n >= c.threshold && !has:
		return c.change(ctx, node, actionTaint, st)
	case !st.annotated && has:
		return c.change(ctx, node, actionUntaint, st)
	}
	return nil
}

// hasTaint reports whether the informer's Node carries Taint; known is
// false when there is no such Node.
func (c *Controller) hasTaint(node string) (has, known bool) {
	obj, ok, err := c.nodes.GetStore().GetByKey(node)
	if err != nil || !ok {
		return false, false
	}
	n, ok := obj.(*corev1.Node)
	return ok && hasTaint(n.Spec.Taints), ok
}

func hasTaint(taints []corev1.Taint) bool {
	for _, t := range taints {
		if t.MatchTaint(&Taint) {
			return true
		}
	}
	return false
}

// HasSynced reports whether both informers have listed their objects:
// from then on every renewal is seen.
func (c *Controller) HasSynced() bool { return c.leases.HasSynced() && c.nodes.HasSynced() }

// Tainted returns the number of Nodes, as the informer sees them, that
// carry Taint.
func (c *Controller) Tainted() int {
	n := 0
	for _, obj := range c.nodes.GetStore().List() {
		if node, ok := obj.(*corev1.Node); ok && hasTaint(node.Spec.Taints) {
			n++
		}
	}
	return n
}

// change adds (actionTaint) or removes (actionUntaint) Taint on the Node,
// leaving its other taints as they are: from the informer's copy first,
// from a GET after a conflict.
func (c *Controller) change(ctx context.Context, node, action string, st streak) error {
	nodes := c.client.CoreV1().Nodes()
	changed := false
	var n *corev1.Node
	if obj, ok, err := c.nodes.GetStore().GetByKey(node); err == nil && ok {
		n, _ = obj.(*corev1.Node)
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if n == nil {
			var err error
			if n, err = nodes.Get(ctx, node, metav1.GetOptions{}); err != nil {
				n = nil
				return err
			}
		}
		if hasTaint(n.Spec.Taints) == (action == actionTaint) {
			return nil // already as wanted
		}
		var taints []corev1.Taint
		for _, t := range n.Spec.Taints {
			if !t.MatchTaint(&Taint) {
				taints = append(taints, t)
			}
		}
		if action == actionTaint {
			taints = append(taints, Taint)
		}
		patch, err := taintsPatch(n.ResourceVersion, taints)
		if err != nil {
			return err
		}
		if _, err := nodes.Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
			n = nil // read it again
			return err
		}
		changed = true
		return nil
	})
	if apierrors.IsNotFound(err) {
		return nil // the Node is gone: nothing to taint
	}
	if err != nil {
		c.changes.WithLabelValues(action, "error").Inc()
		return fmt.Errorf("%s node %s: %w", action, node, err)
	}
	if changed {
		c.changes.WithLabelValues(action, "ok").Inc()
		if action == actionTaint {
			c.log.Info("node tainted: its heartbeats are delegated", "node", node, "taint", Taint.ToString(), "renewals", st.n)
		} else {
			c.log.Info("node untainted: it renews its Lease itself again", "node", node, "taint", Taint.ToString())
		}
	}
	return nil
}

// taintsPatch is a strategic merge patch that sets spec.taints (a list
// without a merge key, so replaced whole) if the Node is still at
// resourceVersion rv; otherwise the apiserver answers Conflict.
func taintsPatch(rv string, taints []corev1.Taint) ([]byte, error) {
	if taints == nil {
		taints = []corev1.Taint{}
	}
	b, err := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": rv},
		"spec":     map[string]any{"taints": taints},
	})
	if err != nil {
		return nil, fmt.Errorf("encode taints patch: %w", err)
	}
	return b, nil
}
