package nodewatch

import (
	"cmp"
	"maps"
	"net/netip"
	"slices"
)

// Reason is why the gateway does not route an address to the edge node
// that claims it. Every consumer of a Snapshot (the transparent proxy,
// DNAT, DNS, VIP assignment) routes exactly what Routes allows, so one
// decision holds everywhere.
type Reason string

const (
	// ReasonConflict: another edge node claims the same address. In
	// node-ip mode the one claim that the claimant registered with (or
	// the operator pinned: Node.Registered) gets it, and when there is no
	// such claim, or more than one, nobody does: arrival order decides
	// nothing. In vip mode, where the gateway assigns the address, the
	// node that held it first keeps it.
	ReasonConflict Reason = "conflict"
	// ReasonTooMany: the node claims more acceptable addresses than
	// Policy.MaxPerNode; its registered ones are kept first, then the
	// others in the order it lists them.
	ReasonTooMany Reason = "too_many"
	// ReasonCloudNode: the address belongs to a Node that is not an edge
	// node (its InternalIP or ExternalIP).
	ReasonCloudNode Reason = "cloud_node"
	// ReasonGatewayHost: the address is one of the gateway host's own
	// (an interface address, or loopback).
	ReasonGatewayHost Reason = "gateway_host"
	// ReasonOutsideRanges: the address lies outside --edge-cidrs (node-ip
	// mode, when set) or outside --vip-cidr (vip mode).
	ReasonOutsideRanges Reason = "outside_ranges"
	// ReasonNotUnicast: multicast, link-local or broadcast: never the
	// address of a host.
	ReasonNotUnicast Reason = "not_unicast"
)

// Reasons lists every Reason, for metrics.
func Reasons() []Reason {
	return []Reason{ReasonConflict, ReasonCloudNode, ReasonGatewayHost, ReasonOutsideRanges, ReasonNotUnicast, ReasonTooMany}
}

// DefaultMaxPerNode is the gateway's default Policy.MaxPerNode: a node
// has one address per family, a few more with a second interface.
const DefaultMaxPerNode = 4

// Policy is what the gateway accepts as an edge node's address.
type Policy struct {
	// Mode picks the addresses an edge node claims: its InternalIPs
	// (node-ip) or its VIP (vip).
	Mode Mode
	// VIPCIDR bounds VIPs in vip mode; addresses in it are exempt from the
	// gateway-host check (the gateway holds them on tether0).
	VIPCIDR netip.Prefix
	// EdgeCIDRs, when not empty, bound edge addresses in node-ip mode.
	EdgeCIDRs []netip.Prefix
	// MaxPerNode, when positive, bounds the addresses routed to one edge
	// node; the claims past it are refused (ReasonTooMany).
	MaxPerNode int
}

// Refusal is one address an edge node claims that the gateway does not
// route to it.
type Refusal struct {
	Addr   netip.Addr `json:"address"`
	Node   string     `json:"node"`
	Reason Reason     `json:"reason"`
	// Holder is, for a conflict, the node the address goes to; "" when it
	// goes to none.
	Holder string `json:"holder,omitempty"`
}

// Routes is the gateway's decision of which edge node each address
// reaches, in one mode. It is immutable once built.
type Routes struct {
	mode    Mode
	owner   map[netip.Addr]string
	byNode  map[string][]netip.Addr
	refused []Refusal
}

// Mode is the address mode the routes were resolved in.
func (r *Routes) Mode() Mode { return r.mode }

// Owner returns the edge node that address a reaches.
func (r *Routes) Owner(a netip.Addr) (string, bool) {
	n, ok := r.owner[a.Unmap()]
	return n, ok
}

// Of returns the addresses that reach node, in the order the node lists
// them. The result must not be modified.
func (r *Routes) Of(node string) []netip.Addr { return r.byNode[node] }

// Len is the number of routed addresses.
func (r *Routes) Len() int { return len(r.owner) }

// Refused lists the refused claims, sorted by address and node. The
// result must not be modified.
func (r *Routes) Refused() []Refusal { return r.refused }

// Resolve decides the routes of the edge nodes in nodes. local are the
// gateway host's own addresses (nil skips that check, and with it the
// loopback one: for tests that run edges on loopback). prev is the
// previous decision (nil at start), read in vip mode only: a VIP it gave
// to a node that still claims it stays with that node. In node-ip mode an
// address several edges claim goes to the one claimant that lists it in
// Node.Registered, and to none when no claimant or several do; when
// claims arrived never matters. Names never break a tie.
func Resolve(nodes map[string]Node, p Policy, local []netip.Addr, prev *Routes) *Routes {
	r := &Routes{mode: p.Mode, owner: map[netip.Addr]string{}, byNode: map[string][]netip.Addr{}}
	reserved := map[netip.Addr]bool{}
	for _, n := range nodes {
		if n.Edge {
			continue
		}
		for _, a := range n.InternalIPs {
			reserved[a] = true
		}
		for _, a := range n.ExternalIPs {
			reserved[a] = true
		}
	}
	isLocal := make(map[netip.Addr]bool, len(local))
	for _, a := range local {
		isLocal[a.Unmap()] = true
	}
	checkLocal := local != nil

	// A claim is registered when its node lists it in Node.Registered
	// (node-ip mode only: a VIP is the gateway's, never registered).
	registered := func(name string, a netip.Addr) bool {
		return p.Mode != ModeVIP && slices.Contains(nodes[name].Registered, a)
	}
	claims := map[netip.Addr][]string{}
	names := slices.Sorted(maps.Keys(nodes))
	for _, name := range names {
		var ok []netip.Addr
		for _, a := range nodes[name].edgeReach(p.Mode) {
			if reason := p.check(a, reserved, isLocal, checkLocal); reason != "" {
				r.refused = append(r.refused, Refusal{Addr: a, Node: name, Reason: reason})
			} else if !slices.Contains(ok, a) {
				ok = append(ok, a)
			}
		}
		// Registered claims first, then the others as the node lists them.
		slices.SortStableFunc(ok, func(x, y netip.Addr) int {
			return cmp.Compare(b2i(!registered(name, x)), b2i(!registered(name, y)))
		})
		for i, a := range ok {
			if p.MaxPerNode > 0 && i >= p.MaxPerNode {
				r.refused = append(r.refused, Refusal{Addr: a, Node: name, Reason: ReasonTooMany})
				continue
			}
			claims[a] = append(claims[a], name)
		}
	}
	for a, cs := range claims {
		holder := ""
		switch {
		case len(cs) == 1:
			holder = cs[0]
		case p.Mode == ModeVIP:
			if prev != nil {
				if h, ok := prev.owner[a]; ok && slices.Contains(cs, h) {
					holder = h
				}
			}
		default:
			if reg := slices.DeleteFunc(slices.Clone(cs), func(c string) bool { return !registered(c, a) }); len(reg) == 1 {
				holder = reg[0]
			}
		}
		if holder != "" {
			r.owner[a] = holder
		}
		if len(cs) > 1 {
			for _, c := range cs {
				if c != holder {
					r.refused = append(r.refused, Refusal{Addr: a, Node: c, Reason: ReasonConflict, Holder: holder})
				}
			}
		}
	}
	for _, name := range names {
		for _, a := range nodes[name].edgeReach(p.Mode) {
			if r.owner[a] == name && !slices.Contains(r.byNode[name], a) {
				r.byNode[name] = append(r.byNode[name], a)
			}
		}
	}
	slices.SortFunc(r.refused, func(x, y Refusal) int {
		return cmp.Or(x.Addr.Compare(y.Addr), cmp.Compare(x.Node, y.Node))
	})
	return r
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// edgeReach returns the node's addresses in mode (Reach), unmapped, none
// when it is not an edge node.
func (n Node) edgeReach(mode Mode) []netip.Addr {
	if !n.Edge {
		return nil
	}
	out := make([]netip.Addr, 0, len(n.Reach(mode)))
	for _, a := range n.Reach(mode) {
		out = append(out, a.Unmap())
	}
	return out
}

// check returns why a is not an acceptable edge address, or "".
func (p Policy) check(a netip.Addr, reserved, local map[netip.Addr]bool, checkLocal bool) Reason {
	switch {
	case !a.IsValid() || a.IsUnspecified() || a.IsMulticast() || a.IsLinkLocalUnicast() ||
		a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return ReasonNotUnicast
	case reserved[a]:
		return ReasonCloudNode
	}
	inVIPs := p.Mode == ModeVIP && p.VIPCIDR.IsValid() && p.VIPCIDR.Contains(a)
	if checkLocal && !inVIPs && (local[a] || a.IsLoopback()) {
		return ReasonGatewayHost
	}
	switch p.Mode {
	case ModeVIP:
		if p.VIPCIDR.IsValid() && !inVIPs {
			return ReasonOutsideRanges
		}
	default:
		if len(p.EdgeCIDRs) > 0 && !slices.ContainsFunc(p.EdgeCIDRs, func(c netip.Prefix) bool { return c.Contains(a) }) {
			return ReasonOutsideRanges
		}
	}
	return ""
}
