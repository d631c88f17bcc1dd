// Package netrules keeps the gateway host's packet filter redirecting TCP
// for edge nodes to the gateway's transparent listener.
//
// The caller describes the whole state it wants (Desired: the addresses of
// every edge node, the proxied ports, the edge nodes' pod ranges, the
// listener's port) and calls Apply whenever that changes and on a resync
// timer. A backend renders the state as rules of Tether's own (an nftables
// table, or iptables chains), compares it with what the kernel holds and
// writes the difference in one transaction. Cleanup removes everything
// Tether created and nothing else.
//
// Rules act on the network namespace of the OS thread that calls their
// methods: the host's, in the gateway; a test's, when the test calls them
// from inside testenv's (*Host).Do. The iptables backend runs iptables
// commands, which inherit the calling thread's namespace.
//
// See README.md for the packet flow, the invariants and how to inspect what
// is installed.
package netrules

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
)

// Desired is the whole state the gateway wants: what to redirect to its
// transparent listener.
type Desired struct {
	// Edges maps a node name to the addresses that reach that node through
	// the gateway: its node IPs, or its VIP in vip mode. IPv4 and IPv6.
	Edges map[string][]netip.Addr
	// Ports are the proxied TCP ports (e.g. 10250, 10255).
	Ports []uint16
	// PodRanges maps a node name to its pod ranges (spec.podCIDRs): TCP
	// to any port of an address inside one is redirected, as an edge
	// address on a proxied port is. IPv4 and IPv6; host bits are ignored.
	// Ranges may repeat or nest, within a node or across nodes: what is
	// redirected is their union (a range inside another is dropped).
	PodRanges map[string][]netip.Prefix
	// ProxyPort is the port of the transparent listener, e.g. 10263. The
	// listener must listen on the wildcard address (":10263"): routed
	// connections arrive on the address of the interface they came in on,
	// local ones on 127.0.0.1 or ::1.
	ProxyPort uint16
}

// Rules programs the redirect rules of one host (one network namespace).
// Its methods are safe for concurrent use.
type Rules interface {
	// Apply makes the installed rules match d. It renders the whole state,
	// checks the kernel for drift (our table or chains flushed or edited by
	// someone else) and writes what differs in one transaction; after any
	// failure, or when it finds drift, it rewrites everything. It leaves the
	// connection tracking entries of destinations it stopped redirecting to
	// FlushConntrack, which the caller runs after Apply returns.
	Apply(ctx context.Context, d Desired) error
	// FlushConntrack deletes the connection tracking entries of TCP
	// connections that the rules redirected since the last flush and no
	// longer redirect the same way (a removed address or port, or every
	// one when the listener's port changed): their NAT binding outlives the
	// rule. It costs a walk of the kernel's conntrack table, and nothing
	// when no Apply removed anything. A caller that never calls it gets the
	// flush done inside Apply after 16 such changes.
	FlushConntrack(ctx context.Context) error
	// Cleanup removes everything Tether created, and nothing else, and
	// flushes the conntrack entries of what it redirected.
	Cleanup(ctx context.Context) error
	// Backend names the backend: "nftables", "iptables" or "none".
	Backend() string
}

// Backend names, as New takes them and Backend returns them.
const (
	KindAuto     = "auto"
	KindNFTables = "nftables"
	KindIPTables = "iptables"
	KindNone     = "none"
)

// Options configures New.
type Options struct {
	// Logger receives what the rules do; nil discards. Full rule dumps are
	// logged at debug level only.
	Logger *slog.Logger
}

func (o Options) logger() *slog.Logger {
	if o.Logger != nil {
		return o.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// New returns the Rules of the given kind: "auto", "nftables", "iptables"
// or "none". "auto" picks the backend the host already uses (see Detect).
// New checks that the backend can work (kernel support, permission) but
// changes nothing; the first Apply installs the rules.
func New(kind string, opts Options) (Rules, error) {
	log := opts.logger()
	switch kind {
	case KindNFTables:
		return newNFTRules(log)
	case KindIPTables:
		return newIPTRules(log, "")
	case KindNone:
		return None{}, nil
	case KindAuto, "":
		d, err := Detect()
		if err != nil {
			return nil, err
		}
		log.Info("netrules: backend chosen", "backend", d.Backend, "iptables_mode", d.IPTablesMode, "reason", d.Reason)
		if d.Backend == KindNFTables {
			return newNFTRules(log)
		}
		return newIPTRules(log, d.IPTablesMode)
	default:
		return nil, fmt.Errorf("netrules: unknown backend %q (want auto, nftables, iptables or none)", kind)
	}
}

// None is the backend that installs nothing, for --netrules=none: the
// operator routes edge traffic to the listener some other way.
type None struct{}

var _ Rules = None{}

func (None) Apply(context.Context, Desired) error { return nil }
func (None) FlushConntrack(context.Context) error { return nil }
func (None) Cleanup(context.Context) error        { return nil }
func (None) Backend() string                      { return KindNone }

// state is a Desired in canonical form: what a backend renders. Addresses
// are unmapped, sorted and unique. owners4[i] and owners6[i] name, for
// comments, the node that claims v4[i] or v6[i] (the first by name, if
// several do). Pod ranges are masked, sorted by address and disjoint:
// a range inside another (or equal to it) is left out, in shadowed, and
// podOwners4[i] and podOwners6[i] name the node of pods4[i] or pods6[i]
// (the first by name, if several claim the same range). No maps: with
// 10,000 nodes, sorted slices are several times cheaper to build, and
// Apply builds one every call.
type state struct {
	v4, v6                 []netip.Addr
	owners4, owners6       []string
	pods4, pods6           []netip.Prefix
	podOwners4, podOwners6 []string
	shadowed               []shadowedRange
	ports                  []uint16
	proxyPort              uint16
}

// shadowedRange is a pod range normalize left out because another range
// (of the same node or another) holds it.
type shadowedRange struct {
	node   string
	rng    netip.Prefix
	inside netip.Prefix
	owner  string // inside's node
}

// rangeClaim is one node's claim on one pod range.
type rangeClaim struct {
	hi, lo uint64 // the range's address as a number, for sorting
	rng    netip.Prefix
	node   string
}

func newRangeClaim(p netip.Prefix, node string) rangeClaim {
	b := p.Addr().As16()
	return rangeClaim{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:]), p, node}
}

// claim is one node's claim on one address.
type claim struct {
	addr netip.Addr
	key  uint32 // the IPv4 address as a number, for sorting
	node string
}

// normalize validates d and puts it in canonical form.
func normalize(d Desired) (*state, error) {
	if d.ProxyPort == 0 {
		return nil, errors.New("netrules: ProxyPort is 0")
	}
	s := &state{proxyPort: d.ProxyPort}
	for _, p := range d.Ports {
		if p == 0 {
			return nil, errors.New("netrules: proxied port 0")
		}
		s.ports = append(s.ports, p)
	}
	slices.Sort(s.ports)
	s.ports = slices.Compact(s.ports)

	var c4, c6 []claim
	for node, addrs := range d.Edges {
		for _, a := range addrs {
			a = a.Unmap()
			if !a.IsValid() || a.Zone() != "" || a.IsUnspecified() {
				return nil, fmt.Errorf("netrules: node %s: unusable address %q", node, a)
			}
			if a.Is4() {
				b := a.As4()
				c4 = append(c4, claim{a, binary.BigEndian.Uint32(b[:]), node})
			} else {
				c6 = append(c6, claim{addr: a, node: node})
			}
		}
	}
	slices.SortFunc(c4, func(x, y claim) int {
		if c := cmp.Compare(x.key, y.key); c != 0 {
			return c
		}
		return strings.Compare(x.node, y.node)
	})
	slices.SortFunc(c6, func(x, y claim) int {
		if c := x.addr.Compare(y.addr); c != 0 {
			return c
		}
		return strings.Compare(x.node, y.node)
	})
	s.v4, s.owners4 = firstClaims(c4)
	s.v6, s.owners6 = firstClaims(c6)

	// Usually one range per node and family.
	r4 := make([]rangeClaim, 0, len(d.PodRanges))
	r6 := make([]rangeClaim, 0, len(d.PodRanges))
	for node, ranges := range d.PodRanges {
		for _, p := range ranges {
			p, err := canonRange(p)
			if err != nil {
				return nil, fmt.Errorf("netrules: node %s: %w", node, err)
			}
			if p.Addr().Is4() {
				r4 = append(r4, newRangeClaim(p, node))
			} else {
				r6 = append(r6, newRangeClaim(p, node))
			}
		}
	}
	s.pods4, s.podOwners4 = s.outerRanges(r4)
	s.pods6, s.podOwners6 = s.outerRanges(r6)
	return s, nil
}

// canonRange returns p masked, an IPv4-mapped range as IPv4. A range of
// every address (length 0) is refused: it would take every TCP connection
// of the host, the gateway's own included.
func canonRange(p netip.Prefix) (netip.Prefix, error) {
	if !p.IsValid() {
		return p, fmt.Errorf("unusable pod range %q", p)
	}
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	if p.Bits() == 0 {
		return p, fmt.Errorf("pod range %s holds every address", p)
	}
	return p.Masked(), nil
}

// outerRanges sorts claims (by address, the wider range first, then by
// node) and returns the ranges no other range holds, each once, with the
// node of each (the first by name among the nodes that claim it). The
// ranges left out are added to s.shadowed. Two ranges either are disjoint
// or one holds the other, so in this order a range overlaps the last one
// kept exactly when that one holds it.
func (s *state) outerRanges(claims []rangeClaim) ([]netip.Prefix, []string) {
	slices.SortFunc(claims, func(x, y rangeClaim) int {
		if x.hi != y.hi {
			return cmp.Compare(x.hi, y.hi)
		}
		if x.lo != y.lo {
			return cmp.Compare(x.lo, y.lo)
		}
		if c := cmp.Compare(x.rng.Bits(), y.rng.Bits()); c != 0 {
			return c
		}
		return strings.Compare(x.node, y.node)
	})
	ranges := make([]netip.Prefix, 0, len(claims))
	owners := make([]string, 0, len(claims))
	for _, c := range claims {
		if n := len(ranges); n > 0 && ranges[n-1].Overlaps(c.rng) {
			if c.node != owners[n-1] || c.rng != ranges[n-1] {
				s.shadowed = append(s.shadowed, shadowedRange{c.node, c.rng, ranges[n-1], owners[n-1]})
			}
			continue
		}
		ranges = append(ranges, c.rng)
		owners = append(owners, c.node)
	}
	return ranges, owners
}

// logShadowed logs, at debug level, the pod ranges left out of s because
// another range holds them.
func (s *state) logShadowed(log *slog.Logger) {
	for _, sh := range s.shadowed {
		log.Debug("netrules: pod range inside another; redirected as part of it",
			"node", sh.node, "range", sh.rng, "inside", sh.inside, "inside_node", sh.owner)
	}
}

// firstClaims returns the addresses of sorted claims, once each, and the
// first node that claims each.
func firstClaims(claims []claim) ([]netip.Addr, []string) {
	addrs := make([]netip.Addr, 0, len(claims))
	owners := make([]string, 0, len(claims))
	for i, c := range claims {
		if i > 0 && c.addr == claims[i-1].addr {
			continue
		}
		addrs = append(addrs, c.addr)
		owners = append(owners, c.node)
	}
	return addrs, owners
}

// find returns the index of a in the addresses of its family, and whether
// s has it.
func (s *state) find(a netip.Addr) (int, bool) {
	addrs := s.v6
	if a.Is4() {
		addrs = s.v4
	}
	return slices.BinarySearchFunc(addrs, a, netip.Addr.Compare)
}

// owner returns the node that claims a, or "".
func (s *state) owner(a netip.Addr) string {
	i, ok := s.find(a)
	switch {
	case !ok:
		return ""
	case a.Is4():
		return s.owners4[i]
	}
	return s.owners6[i]
}

// podRange returns the index of the pod range that holds a among the
// ranges of its family, and whether one does.
func (s *state) podRange(a netip.Addr) (int, bool) {
	ranges := s.pods(6)
	if a.Is4() {
		ranges = s.pods(4)
	}
	i, found := slices.BinarySearchFunc(ranges, a, func(p netip.Prefix, a netip.Addr) int {
		return p.Addr().Compare(a)
	})
	if !found {
		i-- // the last range that starts below a
	}
	return i, i >= 0 && ranges[i].Contains(a)
}

// holdsRange reports whether one of s's pod ranges holds all of p.
func (s *state) holdsRange(p netip.Prefix) bool {
	i, ok := s.podRange(p.Addr())
	if !ok {
		return false
	}
	if p.Addr().Is4() {
		return s.pods4[i].Bits() <= p.Bits()
	}
	return s.pods6[i].Bits() <= p.Bits()
}

// podOwner returns the node of the pod range that holds a, or "".
func (s *state) podOwner(a netip.Addr) string {
	i, ok := s.podRange(a)
	switch {
	case !ok:
		return ""
	case a.Is4():
		return s.podOwners4[i]
	}
	return s.podOwners6[i]
}

// redirects reports whether s sends TCP to a:port to the listener: a is
// an edge address and port a proxied one, or a is in a pod range.
func (s *state) redirects(a netip.Addr, port uint16) bool {
	if s == nil {
		return false
	}
	if _, ok := s.podRange(a); ok {
		return true
	}
	_, ok := s.find(a)
	_, pok := slices.BinarySearch(s.ports, port)
	return ok && pok
}

// addrs returns the addresses of the given family (4 or 6).
func (s *state) addrs(family int) []netip.Addr {
	if family == 4 {
		return s.v4
	}
	return s.v6
}

// pods returns the pod ranges of the given family (4 or 6).
func (s *state) pods(family int) []netip.Prefix {
	if family == 4 {
		return s.pods4
	}
	return s.pods6
}

// sameDestinations reports whether s and o redirect the same addresses,
// ports and pod ranges to the same port: whether their sets hold the same
// elements.
func (s *state) sameDestinations(o *state) bool {
	return o != nil && s.proxyPort == o.proxyPort && slices.Equal(s.v4, o.v4) &&
		slices.Equal(s.v6, o.v6) && slices.Equal(s.ports, o.ports) &&
		slices.Equal(s.pods4, o.pods4) && slices.Equal(s.pods6, o.pods6)
}

// diffSorted returns what is only in want (added) and only in have
// (removed); both are sorted by compare and hold no duplicates.
func diffSorted[T any](have, want []T, compare func(T, T) int) (added, removed []T) {
	i, j := 0, 0
	for i < len(have) || j < len(want) {
		var c int
		switch {
		case i == len(have):
			c = 1
		case j == len(want):
			c = -1
		default:
			c = compare(have[i], want[j])
		}
		switch {
		case c < 0:
			removed = append(removed, have[i])
			i++
		case c > 0:
			added = append(added, want[j])
			j++
		default:
			i++
			j++
		}
	}
	return added, removed
}
