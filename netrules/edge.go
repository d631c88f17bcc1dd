package netrules

// The edge host's rules: connections of the node's pods (and of the node
// itself) to a marked cloud Service's ClusterIP and port go to
// tether-edge's service listener, before kube-proxy's DNAT would send
// them to an endpoint the site cannot route.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
)

// EdgeDesired is the whole state tether-edge wants of its host: what to
// redirect to its service listener.
type EdgeDesired struct {
	// PodNets are the node's pod ranges (spec.podCIDRs): only connections
	// from them are redirected at prerouting. IPv4 and IPv6.
	PodNets []netip.Prefix
	// Services are the marked ClusterIPs and ports.
	Services []netip.AddrPort
	// NodeAddrs are the node's addresses; the first of each family is
	// where prerouting sends a pod's connection (dnat, which works with
	// any CNI, unlike redirect, which needs an address on the interface
	// the packet came in on). Without an address of a family, pods'
	// connections of that family are not redirected.
	NodeAddrs []netip.Addr
	// ListenPort is the service listener's port, e.g. 10271. The listener
	// must listen on the wildcard address.
	ListenPort uint16
}

// EdgeRules programs the edge host's redirect rules (one network
// namespace). Its methods are safe for concurrent use.
type EdgeRules interface {
	// Apply makes the installed rules match d, rewriting them in one
	// transaction when they differ or drifted.
	Apply(ctx context.Context, d EdgeDesired) error
	// Cleanup removes everything it created, and nothing else.
	Cleanup(ctx context.Context) error
	// Backend names the backend: "nftables", "iptables" or "none".
	Backend() string
}

// NewEdge returns the edge's EdgeRules of the given kind: "auto",
// "nftables", "iptables" or "none". "auto" is nftables whatever
// kube-proxy's mode: nft's nat chains and iptables' (nft-compat or
// legacy) share the kernel's list of nat hooks, ordered by priority, so
// the edge's table comes before kube-proxy's DNAT beside any of them
// (TestEdgeHookOrder). On a kernel without nf_tables it is iptables, its
// jumps kept first in nat PREROUTING and OUTPUT.
func NewEdge(kind string, opts Options) (EdgeRules, error) {
	log := opts.logger()
	switch kind {
	case KindNFTables:
		return newEdgeNFT(log)
	case KindIPTables:
		return newEdgeIPT(log, "")
	case KindNone:
		return EdgeNone{}, nil
	case KindAuto, "":
		r, err := newEdgeNFT(log)
		if errors.Is(err, ErrUnsupported) {
			log.Info("netrules: no nf_tables; the edge's rules use iptables", "err", err)
			return newEdgeIPT(log, "")
		}
		return r, err
	default:
		return nil, fmt.Errorf("netrules: unknown backend %q (want auto, nftables, iptables or none)", kind)
	}
}

// EdgeNone is the edge backend that installs nothing: the operator
// redirects pods' connections to the service listener some other way.
type EdgeNone struct{}

var _ EdgeRules = EdgeNone{}

func (EdgeNone) Apply(context.Context, EdgeDesired) error { return nil }
func (EdgeNone) Cleanup(context.Context) error            { return nil }
func (EdgeNone) Backend() string                          { return KindNone }

// edgeState is an EdgeDesired in canonical form: ranges masked, sorted
// and without a range inside another; services and addresses sorted and
// unique; node4 and node6 the addresses prerouting sends to (invalid
// when the node has none of that family).
type edgeState struct {
	pods4, pods6         []netip.Prefix
	services4, services6 []netip.AddrPort
	node4, node6         netip.Addr
	port                 uint16
}

func normalizeEdge(d EdgeDesired) (*edgeState, error) {
	if d.ListenPort == 0 {
		return nil, errors.New("netrules: ListenPort is 0")
	}
	s := &edgeState{port: d.ListenPort}
	var r4, r6 []rangeClaim
	for _, p := range d.PodNets {
		p, err := canonRange(p)
		if err != nil {
			return nil, fmt.Errorf("netrules: %w", err)
		}
		if p.Addr().Is4() {
			r4 = append(r4, newRangeClaim(p, ""))
		} else {
			r6 = append(r6, newRangeClaim(p, ""))
		}
	}
	var st state
	s.pods4, _ = st.outerRanges(r4)
	s.pods6, _ = st.outerRanges(r6)
	for _, ap := range d.Services {
		a := ap.Addr().Unmap()
		if !a.IsValid() || a.Zone() != "" || a.IsUnspecified() || ap.Port() == 0 {
			return nil, fmt.Errorf("netrules: unusable service address %v", ap)
		}
		ap = netip.AddrPortFrom(a, ap.Port())
		if a.Is4() {
			s.services4 = append(s.services4, ap)
		} else {
			s.services6 = append(s.services6, ap)
		}
	}
	for _, l := range []*[]netip.AddrPort{&s.services4, &s.services6} {
		slices.SortFunc(*l, netip.AddrPort.Compare)
		*l = slices.Compact(*l)
	}
	for _, a := range d.NodeAddrs {
		a = a.Unmap()
		switch {
		case !a.IsValid() || a.IsUnspecified() || a.IsLoopback() || a.IsLinkLocalUnicast() || a.Zone() != "":
		case a.Is4() && !s.node4.IsValid():
			s.node4 = a
		case a.Is6() && !s.node6.IsValid():
			s.node6 = a
		}
	}
	return s, nil
}

func (s *edgeState) equal(o *edgeState) bool {
	return o != nil && s.port == o.port && s.node4 == o.node4 && s.node6 == o.node6 &&
		slices.Equal(s.pods4, o.pods4) && slices.Equal(s.pods6, o.pods6) &&
		slices.Equal(s.services4, o.services4) && slices.Equal(s.services6, o.services6)
}

// node returns the node address of a family (4 or 6).
func (s *edgeState) node(family int) netip.Addr {
	if family == 4 {
		return s.node4
	}
	return s.node6
}

// pods returns the pod ranges of a family (4 or 6).
func (s *edgeState) pods(family int) []netip.Prefix {
	if family == 4 {
		return s.pods4
	}
	return s.pods6
}

// services returns the marked ClusterIPs and ports of a family (4 or 6).
func (s *edgeState) services(family int) []netip.AddrPort {
	if family == 4 {
		return s.services4
	}
	return s.services6
}

// edgeLogger is the logger of an edge backend.
func edgeLogger(log *slog.Logger, backend string) *slog.Logger {
	return log.With("backend", backend, "rules", "edge")
}
