package proxy

import (
	"net/netip"
	"strings"

	"github.com/tether-edge/tether/gateway/nodewatch"
)

// route is where a connection goes: the node whose edge gets the stream and
// the address the edge is asked to dial.
type route struct {
	node string
	dial netip.Addr
	pod  bool // dial is an address in the node's pod range
}

// routes is an immutable index built from one nodewatch Snapshot.
type routes struct {
	// byAddr maps each address that reaches an edge node in the active mode
	// to the node: exactly the snapshot's Routes, which leave out every
	// address that is not uniquely that edge's (nodewatch.Resolve).
	byAddr map[netip.Addr]route
	// byName maps each edge node's name to the node.
	byName map[string]route
	// pods are the edge nodes' pod ranges (nodewatch.ResolvePods): an
	// address in one, not in byAddr, reaches that node, which dials the
	// pod address itself (pod addresses are unique in the cluster, in
	// either mode).
	pods *nodewatch.PodRoutes
	// zones are the DNS zones a name may carry after the node name,
	// lowercase and without leading or trailing dots.
	zones []string
}

// normalizeZones returns zones as routes keeps them.
func normalizeZones(zones []string) []string {
	var out []string
	for _, z := range zones {
		if z = strings.Trim(strings.ToLower(z), "."); z != "" {
			out = append(out, z)
		}
	}
	return out
}

// buildRoutes indexes the edge nodes of snap. Where an edge node is reached
// through a VIP, the edge is asked to dial the node's first InternalIP:
// the VIP exists only on the gateway. A node reached by name is dialled at
// its first InternalIP in either mode: its name is its own (the tunnel
// registers under the name in its certificate), whatever addresses it
// claims.
func buildRoutes(snap *nodewatch.Snapshot, mode nodewatch.Mode, zones []string) *routes {
	rs := snap.Routing(mode)
	rt := &routes{
		byAddr: make(map[netip.Addr]route, rs.Len()),
		byName: make(map[string]route),
		pods:   snap.Pods,
		zones:  zones,
	}
	for name, n := range snap.Nodes {
		if !n.Edge || len(n.InternalIPs) == 0 {
			continue
		}
		home := n.InternalIPs[0]
		rt.byName[strings.ToLower(name)] = route{node: name, dial: home}
		for _, a := range rs.Of(name) {
			dial := a
			if mode == nodewatch.ModeVIP {
				dial = home
			}
			rt.byAddr[a] = route{node: name, dial: dial}
		}
	}
	return rt
}

// addr returns the route of a destination address: a node's own address
// (or VIP) first, then the pod range that holds it.
func (rt *routes) addr(a netip.Addr) (route, bool) {
	a = a.Unmap()
	if r, ok := rt.byAddr[a]; ok {
		return r, true
	}
	if node, _, ok := rt.pods.Owner(a); ok {
		return route{node: node, dial: a, pod: true}, true
	}
	return route{}, false
}

// name returns the route of a host name as a client wrote it in SNI or a
// Host header: a node name, the node name under one of the zones, or an
// address that reaches a node. Case and a trailing dot do not matter.
func (rt *routes) name(host string) (route, bool) {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if r, ok := rt.byName[host]; ok {
		return r, true
	}
	for _, z := range rt.zones {
		if base, ok := strings.CutSuffix(host, "."+z); ok {
			if r, ok := rt.byName[base]; ok {
				return r, true
			}
		}
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return rt.addr(a)
	}
	return route{}, false
}
