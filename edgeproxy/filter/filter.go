// Package filter is the service topology filter of tether-edge: it cuts
// the endpoints of EndpointSlices (discovery.k8s.io/v1) and Endpoints (v1)
// down to those a Service's openyurt.io/topologyKeys annotation allows for
// this node, before node components (kube-proxy, coredns, ...) see them.
// See README.md.
package filter

//lint:file-ignore SA1019 core/v1 Endpoints is deprecated but still served and read (kube-proxy, coredns and ingress controllers of older clusters); the topology filter must cover it.

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/tether-edge/tether/internal/openyurt"
)

// Annotations, labels and keys: OpenYurt's names, defined in package
// openyurt.
const (
	AnnotationTopologyKeys  = openyurt.TopologyKeysAnnotation
	LabelNodePool           = openyurt.PoolLabel
	AnnotationUpdateTrigger = openyurt.UpdateTriggerAnnotation

	KeyHostname = openyurt.KeyHostname
	KeyNodePool = openyurt.KeyNodePool
	KeyZone     = openyurt.KeyZone
	KeyAny      = openyurt.KeyAny
)

// ServiceLookup finds the topology annotation of a Service.
type ServiceLookup interface {
	// TopologyKeys is the Service's openyurt.io/topologyKeys; ok is
	// false when the Service is unknown or has no annotation.
	TopologyKeys(namespace, name string) (keys string, ok bool)
}

// NodePools knows which pool each node is in.
type NodePools interface {
	// PoolOf is the node's apps.openyurt.io/nodepool label ("" if none or
	// the node is unknown).
	PoolOf(node string) string
}

// Topology filters endpoints for one node.
type Topology struct {
	Node     string
	Services ServiceLookup
	Pools    NodePools
}

// IsPoolKey reports whether keys (an annotation value) depends on pool
// membership.
func IsPoolKey(keys string) bool { return openyurt.IsPoolKey(keys) }

// keep is the set of endpoints one key keeps: by node name.
type keep func(node string) bool

// rules parses keys into the predicates of its known keys, in order.
// Unknown keys are skipped; none known means no filtering (nil).
func (t Topology) rules(keys string) []keep {
	var out []keep
	for k := range strings.SplitSeq(keys, ",") {
		switch strings.TrimSpace(k) {
		case KeyHostname:
			out = append(out, t.sameNode)
		case KeyNodePool, KeyZone:
			pool := t.Pools.PoolOf(t.Node)
			if pool == "" {
				out = append(out, t.sameNode) // no pool: the node is its own pool
				continue
			}
			out = append(out, func(n string) bool { return n != "" && t.Pools.PoolOf(n) == pool })
		case KeyAny:
			out = append(out, nil) // keeps everything
		}
	}
	return out
}

func (t Topology) sameNode(n string) bool { return n != "" && n == t.Node }

// choose applies the rules to n endpoints (nodeOf(i), ready(i)) and
// returns the indices kept, or all=true when nothing is filtered. With a
// fallback list the first rule that keeps a ready endpoint wins; if none
// does, the first rule's result holds.
func choose(rules []keep, n int, nodeOf func(int) string, ready func(int) bool) (kept []int, all bool) {
	if len(rules) == 0 {
		return nil, true
	}
	var first []int
	for ri, k := range rules {
		if k == nil {
			if ri == 0 || n > 0 && anyReady(n, ready) {
				return nil, true
			}
			continue
		}
		var idx []int
		readyKept := false
		for i := range n {
			if k(nodeOf(i)) {
				idx = append(idx, i)
				readyKept = readyKept || ready(i)
			}
		}
		if ri == 0 {
			first = idx
		}
		if readyKept || len(rules) == 1 {
			return idx, false
		}
	}
	return first, false
}

func anyReady(n int, ready func(int) bool) bool {
	for i := range n {
		if ready(i) {
			return true
		}
	}
	return false
}

// EndpointSlice filters s in place; it reports whether the Service has a
// topology the filter applies (s may be unchanged even so).
func (t Topology) EndpointSlice(s *discoveryv1.EndpointSlice) bool {
	svc := s.Labels[discoveryv1.LabelServiceName]
	if svc == "" {
		return false
	}
	keys, ok := t.Services.TopologyKeys(s.Namespace, svc)
	if !ok {
		return false
	}
	rules := t.rules(keys)
	eps := s.Endpoints
	kept, all := choose(rules, len(eps),
		func(i int) string { return deref(eps[i].NodeName) },
		func(i int) bool { return eps[i].Conditions.Ready == nil || *eps[i].Conditions.Ready })
	if all {
		return len(rules) > 0
	}
	out := make([]discoveryv1.Endpoint, 0, len(kept))
	for _, i := range kept {
		out = append(out, eps[i])
	}
	s.Endpoints = out
	return true
}

// Endpoints filters e in place (its subsets' addresses and not-ready
// addresses; subsets left without any go); it reports whether the
// Service has a topology the filter applies.
func (t Topology) Endpoints(e *corev1.Endpoints) bool {
	keys, ok := t.Services.TopologyKeys(e.Namespace, e.Name)
	if !ok {
		return false
	}
	rules := t.rules(keys)
	if len(rules) == 0 {
		return false
	}
	// All addresses of all subsets, ready ones first per subset.
	type ref struct {
		subset int
		ready  bool
		addr   corev1.EndpointAddress
	}
	var refs []ref
	for si, ss := range e.Subsets {
		for _, a := range ss.Addresses {
			refs = append(refs, ref{si, true, a})
		}
		for _, a := range ss.NotReadyAddresses {
			refs = append(refs, ref{si, false, a})
		}
	}
	kept, all := choose(rules, len(refs),
		func(i int) string { return deref(refs[i].addr.NodeName) },
		func(i int) bool { return refs[i].ready })
	if all {
		return true
	}
	subsets := make([]corev1.EndpointSubset, len(e.Subsets))
	for i, ss := range e.Subsets {
		subsets[i].Ports = ss.Ports
	}
	for _, i := range kept {
		r := refs[i]
		if r.ready {
			subsets[r.subset].Addresses = append(subsets[r.subset].Addresses, r.addr)
		} else {
			subsets[r.subset].NotReadyAddresses = append(subsets[r.subset].NotReadyAddresses, r.addr)
		}
	}
	e.Subsets = subsets[:0]
	for _, ss := range subsets {
		if len(ss.Addresses)+len(ss.NotReadyAddresses) > 0 {
			e.Subsets = append(e.Subsets, ss)
		}
	}
	if len(e.Subsets) == 0 {
		e.Subsets = nil
	}
	return true
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Apply filters an EndpointSlice or Endpoints in place (other objects are
// left alone); it reports whether the object's Service has a topology.
func (t Topology) Apply(obj any) bool {
	switch o := obj.(type) {
	case *discoveryv1.EndpointSlice:
		return t.EndpointSlice(o)
	case *corev1.Endpoints:
		return t.Endpoints(o)
	}
	return false
}
