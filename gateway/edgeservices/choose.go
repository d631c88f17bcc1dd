package edgeservices

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/edgeaccess"
	"github.com/tether-edge/tether/tunnel"
)

// Annotation marks a Service for edge access (package edgeaccess).
const Annotation = edgeaccess.Annotation

// Refusal reasons, as counted.
const (
	ReasonNotMarked       = "not_marked"       // no such Service, or it or the port is not marked
	ReasonNoEndpoints     = "no_endpoints"     // no ready endpoint at all
	ReasonEndpointRefused = "endpoint_refused" // ready endpoints, none the gateway may dial
)

// markedPort returns the Service's TCP port numbered port when the
// Service is marked for it, and why not otherwise.
func markedPort(svc *corev1.Service, port uint16) (corev1.ServicePort, string) {
	return edgeaccess.Port(svc, port)
}

// Eligibility says which endpoint addresses the gateway may dial for an
// edge: addresses of cloud nodes and their pods, never anything of an
// edge, the gateway host, loopback, link-local (the metadata service) or
// multicast.
type Eligibility struct {
	// Snap is the node watcher's view: which Nodes are edges, their pod
	// ranges and routed addresses.
	Snap *nodewatch.Snapshot
	// Mode picks Snap's address routes.
	Mode nodewatch.Mode
	// Local are the gateway host's addresses.
	Local []netip.Addr
	// Denied are ranges never dialled (--edge-cidrs).
	Denied []netip.Prefix
	// Extra are ranges a cloud endpoint may lie in besides the cloud
	// Nodes' pod ranges and addresses (--edge-service-cidrs): the cloud's
	// pod ranges where IPAM leaves spec.podCIDRs empty, or a selectorless
	// Service's addresses. An endpoint on an edge node is refused even in
	// them.
	Extra []netip.Prefix
}

// check returns "" when the gateway may dial a, an endpoint that names
// node (empty for a selectorless Service's hand-made endpoint), and why
// not otherwise.
func (e Eligibility) check(a netip.Addr, node string) string {
	a = a.Unmap()
	switch {
	case !a.IsValid() || a.IsUnspecified() || a.IsLoopback() || a.IsMulticast() || a.IsLinkLocalUnicast() ||
		a.IsLinkLocalMulticast() || a.IsInterfaceLocalMulticast():
		return "not a unicast address of a host"
	case slices.Contains(e.Local, a):
		return "an address of the gateway host"
	case slices.ContainsFunc(e.Denied, func(p netip.Prefix) bool { return p.Contains(a) }):
		return "in --edge-cidrs"
	}
	snap := e.Snap
	if snap == nil {
		snap = &nodewatch.Snapshot{}
	}
	if n, ok := snap.Routing(e.Mode).Owner(a); ok {
		return "routed to edge node " + n
	}
	if n, _, ok := snap.Pods.Owner(a); ok {
		return "in the pod range of edge node " + n
	}
	cloud := func(n nodewatch.Node) bool {
		return !n.Edge && (slices.Contains(n.InternalIPs, a) || slices.Contains(n.ExternalIPs, a) ||
			slices.ContainsFunc(n.PodCIDRs, func(p netip.Prefix) bool { return p.Contains(a) }))
	}
	extra := slices.ContainsFunc(e.Extra, func(p netip.Prefix) bool { return p.Contains(a) })
	if node != "" {
		n, ok := snap.Lookup(node)
		switch {
		case !ok:
			return "on node " + node + ", which the gateway does not know"
		case n.Edge:
			return "on edge node " + node
		case cloud(n) || extra:
			// A cluster whose IPAM leaves spec.podCIDRs empty (Calico,
			// Cilium's cluster pool) names its pod ranges in Extra.
			return ""
		}
		return "not an address of node " + node + " nor in its pod range or --edge-service-cidrs"
	}
	if extra {
		return ""
	}
	for _, n := range snap.Nodes {
		if cloud(n) {
			return ""
		}
	}
	return "names no node, and lies outside the cloud nodes' ranges and --edge-service-cidrs"
}

// endpoints returns the addresses the gateway may dial for sp, a marked
// port of the Service whose EndpointSlices are slices: ready endpoints in
// a slice of the Service's address family, on the port of sp's name, that
// e allows. reason is set when there are none: ReasonNoEndpoints when no
// endpoint is ready, ReasonEndpointRefused when every ready one is
// refused (why names the first refusal).
func endpoints(sp corev1.ServicePort, slices_ []*discoveryv1.EndpointSlice, e Eligibility) (out []netip.AddrPort, reason, why string) {
	ready := 0
	for _, sl := range slices_ {
		if sl.AddressType != discoveryv1.AddressTypeIPv4 && sl.AddressType != discoveryv1.AddressTypeIPv6 {
			continue
		}
		var port int32
		for _, p := range sl.Ports {
			if p.Port != nil && ptrOr(p.Name) == sp.Name && (p.Protocol == nil || *p.Protocol == corev1.ProtocolTCP) {
				port = *p.Port
			}
		}
		if port <= 0 || port > 65535 {
			continue
		}
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && !*ep.Conditions.Ready {
				continue
			}
			for _, s := range ep.Addresses {
				a, err := netip.ParseAddr(s)
				if err != nil {
					continue
				}
				ready++
				if r := e.check(a, ptrOr(ep.NodeName)); r != "" {
					if why == "" {
						why = fmt.Sprintf("endpoint %s: %s", a, r)
					}
					continue
				}
				ap := netip.AddrPortFrom(a.Unmap(), uint16(port))
				if !slices.Contains(out, ap) {
					out = append(out, ap)
				}
			}
		}
	}
	switch {
	case len(out) > 0:
		return out, "", ""
	case ready == 0:
		return nil, ReasonNoEndpoints, "no ready endpoint"
	}
	return nil, ReasonEndpointRefused, why
}

func ptrOr[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// replyFor is the tunnel reply of a refusal reason.
func replyFor(reason, msg string) tunnel.Reply {
	code := tunnel.NoEndpoints
	if reason == ReasonNotMarked {
		code = tunnel.NotMarked
	}
	return tunnel.Reply{Code: code, Message: msg}
}
