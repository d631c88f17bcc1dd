package nodewatch

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
)

// ReasonTooWide: an edge node's pod range is wider (a shorter prefix)
// than PodPolicy allows, which bounds what one Node can shadow even if
// admission was bypassed.
const ReasonTooWide Reason = "too_wide"

// PodReasons lists every Reason a pod range can be refused for, for
// metrics.
func PodReasons() []Reason {
	return []Reason{ReasonConflict, ReasonCloudNode, ReasonGatewayHost, ReasonOutsideRanges, ReasonTooWide}
}

// Default widest pod ranges an edge node may have, per family: a /16 of
// IPv4 (65,536 pods), a /48 of IPv6.
const (
	DefaultWidestPodCIDR4 = 16
	DefaultWidestPodCIDR6 = 48
)

// PodPolicy is what the gateway accepts as an edge node's pod range.
type PodPolicy struct {
	// Ranges are the only prefixes edge pod ranges may lie in
	// (--edge-pod-cidrs). Empty disables pod routing: no range is routed
	// and none is refused.
	Ranges []netip.Prefix
	// Widest4 and Widest6 are the shortest prefix lengths accepted, per
	// family; 0 takes the defaults.
	Widest4, Widest6 int
}

func (p PodPolicy) widest(a netip.Addr) int {
	if a.Is4() {
		return cmp.Or(p.Widest4, DefaultWidestPodCIDR4)
	}
	return cmp.Or(p.Widest6, DefaultWidestPodCIDR6)
}

// PodRefusal is one pod range of an edge node that the gateway does not
// route to it.
type PodRefusal struct {
	Prefix netip.Prefix `json:"prefix"`
	Node   string       `json:"node"`
	Reason Reason       `json:"reason"`
	// With names, for a conflict or a cloud node, the other node.
	With string `json:"with,omitempty"`
}

// PodRoutes is the gateway's decision of which edge node each pod range
// reaches. Routed ranges never overlap one another, so an address lies in
// at most one. It is immutable once built.
type PodRoutes struct {
	byNode  map[string][]netip.Prefix
	lookup  map[int]map[netip.Prefix]string // prefix length (of the 16-byte form for IPv6) → range → node
	lengths []int                           // the keys of lookup, longest first
	refused []PodRefusal
}

// Owner returns the edge node whose pod range holds a, and that range.
func (r *PodRoutes) Owner(a netip.Addr) (node string, within netip.Prefix, ok bool) {
	if r == nil {
		return "", netip.Prefix{}, false
	}
	a = a.Unmap().WithZone("")
	for _, k := range r.lengths {
		bits := podBits(a, k)
		if bits < 0 {
			continue
		}
		p, err := a.Prefix(bits)
		if err != nil {
			continue
		}
		if n, ok := r.lookup[k][p]; ok {
			return n, p, true
		}
	}
	return "", netip.Prefix{}, false
}

// podBits maps a lookup key back to a prefix length for a's family; the
// keys of IPv6 ranges are offset by 128 so the families never share one.
func podBits(a netip.Addr, key int) int {
	if a.Is4() {
		if key > 32 {
			return -1
		}
		return key
	}
	if key < 128 {
		return -1
	}
	return key - 128
}

func podKey(p netip.Prefix) int {
	if p.Addr().Is4() {
		return p.Bits()
	}
	return 128 + p.Bits()
}

// Of returns the pod ranges routed to node. The result must not be
// modified.
func (r *PodRoutes) Of(node string) []netip.Prefix {
	if r == nil {
		return nil
	}
	return r.byNode[node]
}

// ByNode returns every routed range by node. The result must not be
// modified.
func (r *PodRoutes) ByNode() map[string][]netip.Prefix {
	if r == nil {
		return nil
	}
	return r.byNode
}

// Len is the number of routed ranges.
func (r *PodRoutes) Len() int {
	n := 0
	if r != nil {
		for _, ps := range r.byNode {
			n += len(ps)
		}
	}
	return n
}

// Refused lists the refused ranges, sorted by prefix and node. The result
// must not be modified.
func (r *PodRoutes) Refused() []PodRefusal {
	if r == nil {
		return nil
	}
	return r.refused
}

// ResolvePods decides which edge node each pod range reaches: the ranges
// of Node.PodCIDRs (spec.podCIDRs, which the control plane sets and
// node-admission.yaml keeps nodes from writing). A range is refused when
// it lies outside p.Ranges, is wider than p allows, overlaps a cloud
// node's pod range or holds a cloud node's address, holds a gateway host
// address (local; nil skips that check), or overlaps another edge node's
// range or holds an address routed to another edge node (routes, nil for
// none). In a conflict between edges every claimant is refused: no rule
// says which one the control plane meant. The decision depends on nodes,
// local and routes alone, so every replica makes the same one.
func ResolvePods(nodes map[string]Node, p PodPolicy, local []netip.Addr, routes *Routes) *PodRoutes {
	r := &PodRoutes{byNode: map[string][]netip.Prefix{}, lookup: map[int]map[netip.Prefix]string{}}
	if len(p.Ranges) == 0 {
		return r
	}
	// Every range and address that matters, swept in address order: a
	// prefix overlaps another only when one holds the other.
	var items []podItem
	names := slices.Sorted(maps.Keys(nodes))
	for _, name := range names {
		n := nodes[name]
		if !n.Edge {
			for _, pre := range n.PodCIDRs {
				items = append(items, podItem{prefix: pre, node: name, kind: itemCloud})
			}
			for _, a := range slices.Concat(n.InternalIPs, n.ExternalIPs) {
				items = append(items, podItem{prefix: netip.PrefixFrom(a, a.BitLen()), node: name, kind: itemCloud})
			}
			continue
		}
		for _, pre := range n.PodCIDRs {
			switch {
			case !slices.ContainsFunc(p.Ranges, func(in netip.Prefix) bool { return in.Bits() <= pre.Bits() && in.Contains(pre.Addr()) }):
				r.refuse(pre, name, ReasonOutsideRanges, "")
			case pre.Bits() < p.widest(pre.Addr()):
				r.refuse(pre, name, ReasonTooWide, "")
			default:
				items = append(items, podItem{prefix: pre, node: name, kind: itemEdgeRange})
			}
		}
	}
	if local != nil {
		for _, a := range append(slices.Clone(local), netip.IPv6Loopback(), netip.AddrFrom4([4]byte{127, 0, 0, 1})) {
			a = a.Unmap()
			items = append(items, podItem{prefix: netip.PrefixFrom(a, a.BitLen()), kind: itemLocal})
		}
	}
	if routes != nil {
		for a, node := range routes.owner {
			items = append(items, podItem{prefix: netip.PrefixFrom(a, a.BitLen()), node: node, kind: itemEdgeAddr})
		}
	}
	slices.SortFunc(items, func(x, y podItem) int {
		return cmp.Or(x.prefix.Addr().Compare(y.prefix.Addr()), cmp.Compare(x.prefix.Bits(), y.prefix.Bits()),
			cmp.Compare(x.kind, y.kind), cmp.Compare(x.node, y.node))
	})
	var open []int // indexes of items holding the current one, outermost first
	for i := range items {
		for len(open) > 0 && !items[open[len(open)-1]].prefix.Contains(items[i].prefix.Addr()) {
			open = open[:len(open)-1]
		}
		for _, j := range open {
			items[j].against(&items[i])
			items[i].against(&items[j])
		}
		open = append(open, i)
	}
	for _, it := range items {
		if it.kind != itemEdgeRange {
			continue
		}
		if it.reason != "" {
			r.refuse(it.prefix, it.node, it.reason, it.with)
			continue
		}
		r.byNode[it.node] = append(r.byNode[it.node], it.prefix)
		k := podKey(it.prefix)
		if r.lookup[k] == nil {
			r.lookup[k] = map[netip.Prefix]string{}
			r.lengths = append(r.lengths, k)
		}
		r.lookup[k][it.prefix] = it.node
	}
	slices.SortFunc(r.lengths, func(x, y int) int { return cmp.Compare(y, x) })
	slices.SortFunc(r.refused, func(x, y PodRefusal) int {
		return cmp.Or(x.Prefix.Addr().Compare(y.Prefix.Addr()), cmp.Compare(x.Prefix.Bits(), y.Prefix.Bits()), cmp.Compare(x.Node, y.Node))
	})
	return r
}

func (r *PodRoutes) refuse(p netip.Prefix, node string, reason Reason, with string) {
	r.refused = append(r.refused, PodRefusal{Prefix: p, Node: node, Reason: reason, With: with})
}

type itemKind int

const (
	itemEdgeRange itemKind = iota
	itemCloud              // a cloud node's pod range or address
	itemLocal              // a gateway host address
	itemEdgeAddr           // an address routed to an edge node
)

// podItem is a range or address in ResolvePods' sweep; reason is set on
// an edge range once something it overlaps refuses it.
type podItem struct {
	prefix netip.Prefix
	node   string
	kind   itemKind
	reason Reason
	with   string
}

// against records that it overlaps o: a cloud node's range or address
// outranks the gateway host, which outranks a contest between edges.
func (it *podItem) against(o *podItem) {
	if it.kind != itemEdgeRange {
		return
	}
	var reason Reason
	switch o.kind {
	case itemCloud:
		reason = ReasonCloudNode
	case itemLocal:
		reason = ReasonGatewayHost
	case itemEdgeRange, itemEdgeAddr:
		if o.node == it.node {
			return
		}
		reason = ReasonConflict
	}
	if rank(reason) > rank(it.reason) {
		it.reason, it.with = reason, o.node
	}
}

func rank(r Reason) int {
	switch r {
	case ReasonCloudNode:
		return 3
	case ReasonGatewayHost:
		return 2
	case ReasonConflict:
		return 1
	}
	return 0
}
