// Package autonomy keeps the pods of an autonomous edge node bound
// through a loss of the cloud: the gateway's pod binding controller, after
// OpenYurt's. See README.md for the rules, the trade-off and why a node may
// opt itself in.
//
// Data flow: an informer on Nodes, trimmed to their labels and the two
// autonomy annotations, and one on the Pods bound to a node
// (spec.nodeName set), trimmed to what the plan reads and indexed by node,
// feed a queue of pod keys. A pod is queued when it is added or changes
// and its tolerations do not follow its node's Setting, and every pod of a
// node is queued when the node's Setting or edge-ness changes. A worker
// then computes the pod's change (plan) from the informers' copies and
// patches the pod (a strategic merge patch of spec.tolerations, a list
// replaced whole, and the original annotations) with the copy's
// resourceVersion as a precondition: a conflict is retried after a
// back-off from the informer's newer copy. No write is made when nothing
// changes, so gateway replicas running together (each runs the
// controller; the gateway elects no leader of its own) agree and one of
// them wins each change.
//
// Pods on nodes the edge selector does not match are never touched,
// neither are DaemonSet pods (their controller tolerates both taints
// forever), mirror pods of static pods, and pods being deleted.
//
// Metrics: tether_gateway_autonomy_pod_patches_total{action,result} and
// tether_gateway_autonomy_nodes (edge nodes whose annotations ask for
// autonomy, read from the informer at scrape time).
package autonomy

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/tether-edge/tether/internal/openyurt"
)

// Options configure New.
type Options struct {
	// EdgeSelector selects the edge nodes (the gateway's --edge-selector);
	// nil means openyurt.EdgeLabel=true.
	EdgeSelector labels.Selector
	// Logger receives setting changes and patches (info) and failures
	// (warn); nil discards.
	Logger *slog.Logger
	// Registerer, if set, gets the controller's metrics.
	Registerer prometheus.Registerer
	// Limiter, if set, is waited on before each patch: the controller's
	// share of the client's budget, so that many pods at once (an
	// annotation set on many nodes, or a node toggling its own) cannot
	// take all of it.
	Limiter *rate.Limiter
}

// Controller sets the tolerations of autonomous edge nodes' pods.
type Controller struct {
	client kubernetes.Interface
	edge   labels.Selector
	log    *slog.Logger
	limit  *rate.Limiter // nil: none
	nodes  cache.SharedIndexInformer
	pods   cache.SharedIndexInformer
	queue  workqueue.TypedRateLimitingInterface[string] // pod keys, namespace/name
	*metrics

	mu      sync.Mutex
	invalid map[string]string // guarded by mu; node → the annotation value last warned about
}

// byNode indexes the pod informer by spec.nodeName.
const byNode = "node"

// Patch actions (metric label).
const (
	actionHold    = "hold"    // tolerations set for autonomy
	actionRestore = "restore" // the recorded originals put back
)

// New builds the controller; Run runs it.
func New(client kubernetes.Interface, o Options) (*Controller, error) {
	c := &Controller{
		client:  client,
		edge:    o.EdgeSelector,
		log:     o.Logger,
		limit:   o.Limiter,
		invalid: map[string]string{},
		nodes:   coreinformers.NewNodeInformer(client, 0, cache.Indexers{}),
		pods: coreinformers.NewFilteredPodInformer(client, metav1.NamespaceAll, 0, cache.Indexers{byNode: podNode},
			func(lo *metav1.ListOptions) {
				lo.FieldSelector = fields.OneTermNotEqualSelector("spec.nodeName", "").String()
			}),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "autonomy"}),
	}
	if c.edge == nil {
		c.edge = labels.SelectorFromSet(labels.Set{openyurt.EdgeLabel: "true"})
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if err := c.nodes.SetTransform(trimNode); err != nil {
		return nil, fmt.Errorf("set node transform: %w", err)
	}
	if err := c.pods.SetTransform(trimPod); err != nil {
		return nil, fmt.Errorf("set pod transform: %w", err)
	}
	if _, err := c.nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.nodeChanged(nil, obj) },
		UpdateFunc: c.nodeChanged,
	}); err != nil {
		return nil, fmt.Errorf("add node event handler: %w", err)
	}
	if _, err := c.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.podChanged,
		UpdateFunc: func(_, obj any) { c.podChanged(obj) },
	}); err != nil {
		return nil, fmt.Errorf("add pod event handler: %w", err)
	}
	var err error
	if c.metrics, err = newMetrics(o.Registerer, func() float64 { return float64(c.Autonomous()) }); err != nil {
		return nil, fmt.Errorf("register autonomy metrics: %w", err)
	}
	return c, nil
}

func podNode(obj any) ([]string, error) {
	if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName != "" {
		return []string{p.Spec.NodeName}, nil
	}
	return nil, nil
}

// trimNode keeps the name, the labels and the autonomy annotations.
func trimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil // a DeletedFinalStateUnknown tombstone
	}
	var ann map[string]string
	for _, k := range []string{openyurt.AutonomyAnnotation, openyurt.AutonomyDurationAnnotation} {
		if v, ok := n.Annotations[k]; ok {
			if ann == nil {
				ann = map[string]string{}
			}
			ann[k] = v
		}
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, ResourceVersion: n.ResourceVersion, Labels: n.Labels, Annotations: ann}}, nil
}

// trimPod keeps what skip and plan read, and the resourceVersion the
// patch is based on.
func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	var ann map[string]string
	for _, k := range []string{corev1.MirrorPodAnnotationKey, held[0].original, held[1].original} {
		if v, ok := p.Annotations[k]; ok {
			if ann == nil {
				ann = map[string]string{}
			}
			ann[k] = v
		}
	}
	var owners []metav1.OwnerReference
	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" {
			owners = append(owners, metav1.OwnerReference{APIVersion: o.APIVersion, Kind: o.Kind, Name: o.Name, UID: o.UID})
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			DeletionTimestamp: p.DeletionTimestamp, Annotations: ann, OwnerReferences: owners},
		Spec: corev1.PodSpec{NodeName: p.Spec.NodeName, Tolerations: p.Spec.Tolerations},
	}, nil
}

// skip reports whether autonomy leaves pod alone whatever its node: a
// DaemonSet's pod, a static pod's mirror, a pod being deleted.
func skip(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Annotations[corev1.MirrorPodAnnotationKey] != "" {
		return true
	}
	for _, o := range p.OwnerReferences {
		if o.Kind == "DaemonSet" {
			return true
		}
	}
	return false
}

// nodeSetting returns the Setting of the informer's Node named name, and
// whether it is an edge node; ok is false when there is no such Node or it
// is no edge node.
func (c *Controller) nodeSetting(name string) (s Setting, ok bool) {
	obj, exists, err := c.nodes.GetStore().GetByKey(name)
	if err != nil || !exists {
		return Setting{}, false
	}
	n, isNode := obj.(*corev1.Node)
	if !isNode || !c.edge.Matches(labels.Set(n.Labels)) {
		return Setting{}, false
	}
	s, _ = NodeSetting(n.Annotations) // an invalid value is logged by nodeChanged
	return s, true
}

// nodeChanged queues every pod of an edge node whose Setting or
// edge-ness changed (old is nil for an added Node).
func (c *Controller) nodeChanged(old, obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	edge := c.edge.Matches(labels.Set(n.Labels))
	s, err := NodeSetting(n.Annotations)
	c.noteInvalid(n.Name, n.Annotations[openyurt.AutonomyDurationAnnotation], edge, err)
	if o, ok := old.(*corev1.Node); ok {
		os, _ := NodeSetting(o.Annotations)
		oedge := c.edge.Matches(labels.Set(o.Labels))
		if oedge == edge && os.Equal(s) {
			return
		}
		if edge && !os.Equal(s) {
			c.log.Info("node autonomy changed", "node", n.Name, "from", os.String(), "to", s.String())
		}
	}
	if !edge {
		return
	}
	objs, err := c.pods.GetIndexer().ByIndex(byNode, n.Name)
	if err != nil {
		return
	}
	for _, obj := range objs {
		c.podChanged(obj)
	}
}

// noteInvalid warns once per value about an edge node's autonomy
// duration that does not parse.
func (c *Controller) noteInvalid(node, value string, edge bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil || !edge {
		delete(c.invalid, node)
		return
	}
	if c.invalid[node] == value {
		return
	}
	c.invalid[node] = value
	c.log.Warn("node autonomy annotation ignored: its pods are evicted as usual", "node", node, "err", err)
}

// podChanged queues a pod whose tolerations do not follow its node's
// Setting.
func (c *Controller) podChanged(obj any) {
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Spec.NodeName == "" || skip(p) {
		return
	}
	s, ok := c.nodeSetting(p.Spec.NodeName)
	if !ok {
		return
	}
	if _, changed := plan(p, s); changed {
		key, err := cache.MetaNamespaceKeyFunc(p)
		if err == nil {
			c.queue.Add(key)
		}
	}
}

// Run runs the informers and the worker until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { c.nodes.RunWithContext(ctx) })
	wg.Go(func() { c.pods.RunWithContext(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), c.HasSynced) {
		return nil
	}
	// Pods seen before their Node (or the other way round) were not
	// judged: judge every bound pod once now.
	for _, obj := range c.pods.GetStore().List() {
		c.podChanged(obj)
	}
	c.log.Info("autonomy controller synced", "autonomous_nodes", c.Autonomous(), "queued_pods", c.queue.Len())
	context.AfterFunc(ctx, c.queue.ShutDown)
	for c.processNext(ctx) {
	}
	return nil
}

// HasSynced reports whether both informers have listed their objects.
func (c *Controller) HasSynced() bool { return c.nodes.HasSynced() && c.pods.HasSynced() }

// Autonomous returns the number of edge Nodes, as the informer sees them,
// whose annotations ask for autonomy.
func (c *Controller) Autonomous() int {
	n := 0
	for _, obj := range c.nodes.GetStore().List() {
		if node, ok := obj.(*corev1.Node); ok && c.edge.Matches(labels.Set(node.Labels)) {
			if s, _ := NodeSetting(node.Annotations); s.Autonomous {
				n++
			}
		}
	}
	return n
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if err := c.reconcile(ctx, key); err != nil {
		c.log.Warn("pod autonomy", "pod", key, "err", err)
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

// reconcile patches the pod named key if its tolerations do not follow
// its node's Setting, from the informers' copies.
func (c *Controller) reconcile(ctx context.Context, key string) error {
	obj, exists, err := c.pods.GetStore().GetByKey(key)
	if err != nil || !exists {
		return nil
	}
	p, ok := obj.(*corev1.Pod)
	if !ok || skip(p) {
		return nil
	}
	s, ok := c.nodeSetting(p.Spec.NodeName)
	if !ok {
		return nil
	}
	ch, changed := plan(p, s)
	if !changed {
		return nil
	}
	action := actionRestore
	if s.Autonomous {
		action = actionHold
	}
	patch, err := podPatch(p.ResourceVersion, ch)
	if err != nil {
		return err
	}
	if c.limit != nil {
		if err := c.limit.Wait(ctx); err != nil {
			return fmt.Errorf("wait for the patch budget: %w", err)
		}
	}
	_, err = c.client.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil // deleted meanwhile
	}
	if err != nil {
		c.patches.WithLabelValues(action, "error").Inc()
		return fmt.Errorf("patch tolerations (%s, node %s autonomy %s): %w", action, p.Spec.NodeName, s, err)
	}
	c.patches.WithLabelValues(action, "ok").Inc()
	c.log.Debug("pod tolerations patched", "pod", key, "node", p.Spec.NodeName, "action", action, "autonomy", s.String())
	return nil
}

// podPatch is a strategic merge patch that sets spec.tolerations (a list
// without a merge key, so replaced whole) and the annotations of ch, if
// the pod is still at resourceVersion rv; otherwise the apiserver answers
// Conflict.
func podPatch(rv string, ch change) ([]byte, error) {
	meta := map[string]any{"resourceVersion": rv}
	if len(ch.annotations) > 0 {
		meta["annotations"] = ch.annotations
	}
	tols := ch.tolerations
	if tols == nil {
		tols = []corev1.Toleration{}
	}
	b, err := json.Marshal(map[string]any{"metadata": meta, "spec": map[string]any{"tolerations": tols}})
	if err != nil {
		return nil, fmt.Errorf("encode tolerations patch: %w", err)
	}
	return b, nil
}
