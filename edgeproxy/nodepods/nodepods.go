// Package nodepods is what tether-edge knows of its own node's pods, for
// the tunnel's allow list (edgetunnel.PodSource): the node's pod ranges
// from its own Node, and its pods by address.
//
// Two informers read through the apiserver proxy in process, as the node
// (Client, component tether-edge-pods, cached, so that they sync from the
// cache while the cloud is away):
//
//	Node  fieldSelector metadata.name=<node>  → spec.podCIDRs (spec.podCIDR)
//	Pods  fieldSelector spec.nodeName=<node>  → indexed by status.podIPs
//
// The Node authorizer allows both to a node identity without RBAC: a node
// may get, list and watch its own Node (by name, which a list takes from
// its metadata.name selector) and list and watch the pods whose
// spec.nodeName selector names it. Lookups never wait for the informers:
// until they have synced, the ranges or pods are not known.
package nodepods

import (
	"context"
	"net/netip"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/edgeproxy/apiproxy"
	"github.com/tether-edge/tether/edgeproxy/edgetunnel"
	"github.com/tether-edge/tether/internal/kube"
)

// UserAgent is the component name of the informers' requests.
const UserAgent = "tether-edge-pods"

// Client is the informers as an internal client of the apiserver proxy
// (apiproxy.Loopback): their reads are cached, so that the allow list
// knows the node's pods offline, and never answered from the node pool,
// which serves neither resource.
var Client = apiproxy.Internal{Name: UserAgent, Cached: true, NotFromPool: true}

// ipIndex indexes pods by the addresses of their status.
const ipIndex = "ip"

// Pods is the real edgetunnel.PodSource.
type Pods struct {
	node     string
	nodeInf  cache.SharedIndexInformer
	podInf   cache.SharedIndexInformer
	informer []cache.SharedIndexInformer
	running  sync.WaitGroup
}

var _ edgetunnel.PodSource = (*Pods)(nil)

// New builds the informers of node's Node and pods; client reaches the
// apiserver as the node. Start runs them.
func New(node string, client *kube.Client) *Pods {
	nodes := cache.NewSharedIndexInformer(
		kube.ListWatch(selected[*corev1.NodeList]{client.Nodes(), fields.OneTermEqualSelector("metadata.name", node).String()}),
		&corev1.Node{}, 0, cache.Indexers{})
	pods := cache.NewSharedIndexInformer(
		kube.ListWatch(selected[*corev1.PodList]{client.Pods(""), fields.OneTermEqualSelector("spec.nodeName", node).String()}),
		&corev1.Pod{}, 0, cache.Indexers{ipIndex: indexIPs})
	// Keep only what the allow list reads of each object.
	_ = nodes.SetTransform(trimNode)
	_ = pods.SetTransform(trimPod)
	return &Pods{node: node, nodeInf: nodes, podInf: pods, informer: []cache.SharedIndexInformer{nodes, pods}}
}

// Start runs the informers until ctx ends.
func (p *Pods) Start(ctx context.Context) {
	for _, i := range p.informer {
		p.running.Go(func() { i.RunWithContext(ctx) })
	}
}

// Shutdown waits for the informers to stop (after ctx of Start ended).
func (p *Pods) Shutdown() { p.running.Wait() }

// HasSynced reports whether both informers have synced.
func (p *Pods) HasSynced() bool { return p.nodeInf.HasSynced() && p.podInf.HasSynced() }

// PodRanges implements edgetunnel.PodSource.
func (p *Pods) PodRanges() ([]netip.Prefix, bool) {
	if !p.nodeInf.HasSynced() {
		return nil, false
	}
	o, ok, err := p.nodeInf.GetStore().GetByKey(p.node)
	if err != nil || !ok {
		return nil, true // no Node (yet): no ranges
	}
	n, ok := o.(*corev1.Node)
	if !ok {
		return nil, true
	}
	return Ranges(n), true
}

// InternalIPs are the node's InternalIP addresses (status.addresses, as
// its kubelet reported them); ok is false until the Node informer has
// synced.
func (p *Pods) InternalIPs() ([]netip.Addr, bool) {
	if !p.nodeInf.HasSynced() {
		return nil, false
	}
	o, ok, err := p.nodeInf.GetStore().GetByKey(p.node)
	if err != nil || !ok {
		return nil, true
	}
	n, ok := o.(*corev1.Node)
	if !ok {
		return nil, true
	}
	var out []netip.Addr
	for _, a := range n.Status.Addresses {
		if ip, err := netip.ParseAddr(a.Address); err == nil && a.Type == corev1.NodeInternalIP {
			out = append(out, ip.Unmap())
		}
	}
	return out, true
}

// PodsByIP implements edgetunnel.PodSource.
func (p *Pods) PodsByIP(ip netip.Addr) ([]*corev1.Pod, bool) {
	if !p.podInf.HasSynced() {
		return nil, false
	}
	objs, err := p.podInf.GetIndexer().ByIndex(ipIndex, ip.Unmap().String())
	if err != nil {
		return nil, true
	}
	out := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		if pod, ok := o.(*corev1.Pod); ok && pod.Spec.NodeName == p.node {
			out = append(out, pod)
		}
	}
	return out, true
}

// Ranges are a Node's pod ranges, masked: spec.podCIDRs, else
// spec.podCIDR. Unparsable entries are left out.
func Ranges(n *corev1.Node) []netip.Prefix {
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	var out []netip.Prefix
	for _, c := range cidrs {
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}

// indexIPs is the pods' address index: their status addresses.
func indexIPs(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	ips := edgetunnel.PodIPs(pod)
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	return out, nil
}

// trimNode keeps a Node's name, pod ranges and InternalIP addresses.
func trimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion},
		Spec:       corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
		Status:     corev1.NodeStatus{Addresses: internalAddrs(n.Status.Addresses)},
	}, nil
}

// trimPod keeps what the allow list reads of a pod: its name, the
// tether.io/tunnel-ports annotation, node, hostNetwork, containers'
// ports, phase and addresses.
func trimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID, ResourceVersion: pod.ResourceVersion},
		Spec:       corev1.PodSpec{NodeName: pod.Spec.NodeName, HostNetwork: pod.Spec.HostNetwork},
		Status:     corev1.PodStatus{Phase: pod.Status.Phase, PodIP: pod.Status.PodIP, PodIPs: pod.Status.PodIPs},
	}
	if v, ok := pod.Annotations[edgetunnel.AnnotationTunnelPorts]; ok {
		out.Annotations = map[string]string{edgetunnel.AnnotationTunnelPorts: v}
	}
	ports := func(cs []corev1.Container) []corev1.Container {
		var kept []corev1.Container
		for _, c := range cs {
			if len(c.Ports) > 0 {
				kept = append(kept, corev1.Container{Name: c.Name, Ports: c.Ports})
			}
		}
		return kept
	}
	out.Spec.Containers, out.Spec.InitContainers = ports(pod.Spec.Containers), ports(pod.Spec.InitContainers)
	return out, nil
}

// selected is a typed client whose lists and watches carry a field
// selector.
type selected[L runtime.Object] struct {
	c     kube.ListerWatcher[L]
	field string
}

func (s selected[L]) List(ctx context.Context, o metav1.ListOptions) (L, error) {
	o.FieldSelector = s.field
	return s.c.List(ctx, o)
}

func (s selected[L]) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	o.FieldSelector = s.field
	return s.c.Watch(ctx, o)
}

// internalAddrs keeps the InternalIP addresses of a Node's status.
func internalAddrs(as []corev1.NodeAddress) []corev1.NodeAddress {
	var out []corev1.NodeAddress
	for _, a := range as {
		if a.Type == corev1.NodeInternalIP {
			out = append(out, a)
		}
	}
	return out
}
