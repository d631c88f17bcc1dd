package nodewatch

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/tether-edge/tether/internal/openyurt"
)

// Labels and annotations read from Node objects (OpenYurt-compatible, see
// docs/design.md, "Labels and annotations").
const (
	// EdgeLabel marks an edge node when it is "true"; it is the default edge
	// selector.
	EdgeLabel = openyurt.EdgeLabel
	// PoolLabel names the node pool of a node.
	PoolLabel = openyurt.PoolLabel
	// VIPAnnotation holds the virtual IP of an edge node in vip mode.
	VIPAnnotation = "tether.io/vip"
	// RegisteredAnnotation lists, comma-separated, the addresses a Node
	// registered with: node-admission.yaml's MutatingAdmissionPolicy
	// stamps it from status.addresses when the Node is created, and its
	// ValidatingAdmissionPolicy keeps a node from changing it. The
	// operator may set it (pin a node's addresses). In a contest for an
	// address, a claim listed here beats one that is not (Resolve).
	RegisteredAnnotation = "tether.io/registered-addresses"
)

// DefaultEdgeSelector selects nodes labelled openyurt.io/is-edge-worker=true.
func DefaultEdgeSelector() labels.Selector {
	return labels.SelectorFromSet(labels.Set{EdgeLabel: "true"})
}

// Mode is the gateway's address mode: how cloud clients address an edge node.
type Mode string

const (
	// ModeNodeIP: clients use the node's own address; the VPC routes the
	// edge ranges to the gateway.
	ModeNodeIP Mode = "node-ip"
	// ModeVIP: clients use a virtual IP per edge node that the gateway
	// holds (needed when sites reuse the same private ranges).
	ModeVIP Mode = "vip"
)

// ParseMode parses the value of --mode.
func ParseMode(s string) (Mode, error) {
	switch m := Mode(s); m {
	case ModeNodeIP, ModeVIP:
		return m, nil
	}
	return "", fmt.Errorf("unknown address mode %q (want %q or %q)", s, ModeNodeIP, ModeVIP)
}

// Node is what the gateway knows about one Kubernetes Node. Addresses come
// from the Node object written by the kubelet and the API server, never
// from what the edge claims over its tunnel. A Node is immutable once it is
// part of a published Snapshot: its slices are never modified.
type Node struct {
	Name string
	// Edge reports whether the node matches the edge selector.
	Edge bool
	// Pool is the value of the apps.openyurt.io/nodepool label.
	Pool string
	// InternalIPs are the node's InternalIP addresses from status.addresses,
	// in the order the API gives them; when a node has no InternalIP its
	// ExternalIP addresses stand in.
	InternalIPs []netip.Addr
	// ExternalIPs are the node's ExternalIP addresses. The gateway never
	// routes an address of a cloud node, of either kind, to an edge.
	ExternalIPs []netip.Addr
	// VIP is the tether.io/vip annotation when present and a valid address;
	// the zero Addr otherwise.
	VIP netip.Addr
	// Registered are the valid addresses of the
	// tether.io/registered-addresses annotation: those the Node registered
	// with, or that the operator pinned.
	Registered []netip.Addr
	// PodCIDRs are the node's pod ranges (spec.podCIDRs, or spec.podCIDR
	// when that is all there is), masked: set by the control plane (node
	// IPAM) or the operator, never by the node (node-admission.yaml).
	// Pods' status IPs, which the node writes, are never read.
	PodCIDRs []netip.Prefix
}

// Reach returns the addresses that reach the node in the given mode: for an
// edge node its InternalIPs in node-ip mode and its VIP (if any) in vip
// mode; for a cloud node always its own InternalIPs, which need no gateway.
// The result must not be modified.
func (n Node) Reach(mode Mode) []netip.Addr {
	if n.Edge && mode == ModeVIP {
		if !n.VIP.IsValid() {
			return nil
		}
		return []netip.Addr{n.VIP}
	}
	return n.InternalIPs
}

// Equal reports whether two Nodes hold the same data.
func (n Node) Equal(o Node) bool {
	return n.Name == o.Name && n.Edge == o.Edge && n.Pool == o.Pool &&
		n.VIP == o.VIP && slices.Equal(n.InternalIPs, o.InternalIPs) && slices.Equal(n.ExternalIPs, o.ExternalIPs) &&
		slices.Equal(n.Registered, o.Registered) && slices.Equal(n.PodCIDRs, o.PodCIDRs)
}

// fromObject converts a Node object. The returned warning is non-empty when
// an annotation or address was ignored because it did not parse.
func fromObject(obj *corev1.Node, edge labels.Selector) (n Node, warning string) {
	n = Node{
		Name: obj.Name,
		Edge: edge.Matches(labels.Set(obj.Labels)),
		Pool: obj.Labels[PoolLabel],
	}
	var w string
	n.InternalIPs, warning = addresses(obj.Status.Addresses, corev1.NodeInternalIP)
	n.ExternalIPs, w = addresses(obj.Status.Addresses, corev1.NodeExternalIP)
	warning = join(warning, w)
	if len(n.InternalIPs) == 0 {
		n.InternalIPs = n.ExternalIPs
	}
	if v, ok := obj.Annotations[VIPAnnotation]; ok {
		a, err := netip.ParseAddr(v)
		if err == nil && a.Zone() == "" && !a.IsUnspecified() {
			n.VIP = a.Unmap()
		} else {
			warning = join(warning, fmt.Sprintf("invalid %s annotation %q", VIPAnnotation, v))
		}
	}
	if v, ok := obj.Annotations[RegisteredAnnotation]; ok {
		for f := range strings.SplitSeq(v, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			a, err := netip.ParseAddr(f)
			if err != nil || a.Zone() != "" || a.IsUnspecified() {
				warning = join(warning, fmt.Sprintf("invalid address %q in the %s annotation", f, RegisteredAnnotation))
				continue
			}
			if a = a.Unmap(); !slices.Contains(n.Registered, a) {
				n.Registered = append(n.Registered, a)
			}
		}
	}
	n.PodCIDRs, w = podCIDRs(obj.Spec)
	warning = join(warning, w)
	return n, warning
}

// podCIDRs returns the parsed, masked, de-duplicated pod ranges of spec.
func podCIDRs(spec corev1.NodeSpec) (out []netip.Prefix, warning string) {
	list := spec.PodCIDRs
	if len(list) == 0 && spec.PodCIDR != "" {
		list = []string{spec.PodCIDR}
	}
	for _, s := range list {
		p, err := netip.ParsePrefix(s)
		if err != nil || p.Addr().Zone() != "" {
			warning = join(warning, fmt.Sprintf("invalid pod range %q", s))
			continue
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		if p = p.Masked(); p.IsValid() && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, warning
}

// addresses returns the parsed, de-duplicated addresses of one type.
func addresses(as []corev1.NodeAddress, typ corev1.NodeAddressType) (out []netip.Addr, warning string) {
	for _, a := range as {
		if a.Type != typ {
			continue
		}
		ip, err := netip.ParseAddr(a.Address)
		if err != nil || ip.Zone() != "" || ip.IsUnspecified() {
			warning = join(warning, fmt.Sprintf("invalid %s address %q", typ, a.Address))
			continue
		}
		ip = ip.Unmap()
		if !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	return out, warning
}

func join(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}
