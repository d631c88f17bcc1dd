package testenv

// Test networks: a cloud LAN and edge sites behind NAT.
//
// NewTopology builds, from network namespaces joined by veth pairs and
// Linux bridges, the network Tether runs in:
//
//	 cloud hosts (eth0 10.0.0.10, .11, ...)
//	        |  one veth each (c0, c1, ... on the bridge)
//	 +------+---------------------------------------+
//	 | cloud router: bridge br0 10.0.0.1/24         |  ip_forward=1, no NAT,
//	 |   s0 100.64.0.1/24   s1 100.64.1.1/24  ...   |  no route to site LANs
//	 +------+------------------+--------------------+
//	        | uplink veth      | uplink veth
//	 +------+-------------+  +-+-------------------+
//	 | site 0 router      |  | site 1 router       |  ip_forward=1,
//	 |  wan0 100.64.0.2   |  |  wan0 100.64.1.2    |  masquerade out of wan0,
//	 |  lan0 192.168.1.1  |  |  lan0 192.168.1.1   |  new connections in from
//	 +------+-------------+  +-+-------------------+  wan0 dropped
//	        | h0, h1, ... on bridge lan0
//	 site hosts (eth0 192.168.1.10, .11, ...)
//
// Address plan (IPv4 only):
//   - Cloud LAN: TopologySpec.CloudLAN, default 10.0.0.0/24. The cloud
//     router has .1 on bridge br0; cloud host i (in TopologySpec.CloudHosts
//     order) has .10+i on eth0, default route via .1.
//   - Uplink of site i (in TopologySpec.Sites order): 100.64.i.0/24 (shared
//     address space, as a carrier-grade NAT would use), cloud router .1 on
//     s<i>, site router .2 on wan0 with its default route via .1. The site
//     router's .2 is the site's public address (Site.PublicAddr): the
//     source address cloud hosts see for everything from that site.
//   - Site LAN: SiteSpec.LAN, default 192.168.1.0/24 for every site (sites
//     may reuse one private range, as real ones do). The site router has .1
//     on bridge lan0; site host j has .10+j on eth0, default route via .1.
//
// Edge to cloud works (masquerade at the site router); cloud to edge does
// not: cloud hosts and the cloud router have no route to any site LAN, and
// a site router drops connections that start on its wan0 side (to itself
// or forwarded), as a home or factory NAT router does. Interface names are
// the same in every namespace; only namespace names are unique.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// TopologySpec describes the network NewTopology builds.
type TopologySpec struct {
	// CloudHosts names the hosts on the cloud LAN ("gw1", "apiserver").
	CloudHosts []string
	// Sites are the edge sites, each a LAN behind its own NAT router.
	Sites []SiteSpec
	// CloudLAN is the cloud LAN's prefix; default 10.0.0.0/24.
	CloudLAN netip.Prefix
}

// SiteSpec describes one edge site.
type SiteSpec struct {
	// Name names the site; unique in the topology.
	Name string
	// Hosts names the hosts on the site's LAN; unique in the site.
	Hosts []string
	// LAN is the site's private prefix; default 192.168.1.0/24. Sites may
	// use the same one.
	LAN netip.Prefix
}

// Topology is a cloud LAN and edge sites behind NAT, built by NewTopology.
type Topology struct {
	// CloudLAN is the cloud LAN's prefix.
	CloudLAN netip.Prefix
	// Router is the cloud router: it holds the cloud LAN's bridge, is the
	// cloud hosts' default gateway and routes to the site uplinks.
	Router *Host
	// CloudHosts are the hosts on the cloud LAN, in spec order.
	CloudHosts []*Host
	// Sites are the edge sites, in spec order.
	Sites []*Site

	t T
}

// Site is one edge site: a LAN of hosts behind a NAT router.
type Site struct {
	// Name is the site's name from its spec.
	Name string
	// LAN is the site's private prefix.
	LAN netip.Prefix
	// PublicAddr is the address of the site router's uplink: after NAT,
	// the source address of all the site's traffic as the cloud sees it.
	PublicAddr netip.Addr
	// Hosts are the hosts on the site's LAN, in spec order.
	Hosts []*Host

	t      T
	router *Host
	cloud  *Host  // the cloud router
	uplink string // the cloud router's end of the uplink
	wan    wanShaper
}

// Fixed names of interfaces; each lives in its own namespace.
const (
	hostIf       = "eth0" // a host's LAN interface
	cloudBridge  = "br0"  // the cloud LAN, in the cloud router
	siteBridge   = "lan0" // a site's LAN, in its router
	siteUplink   = "wan0" // a site router's uplink
	firstHostNum = 10     // host i gets the LAN's address .10+i
)

var (
	defaultCloudLAN = netip.MustParsePrefix("10.0.0.0/24")
	defaultSiteLAN  = netip.MustParsePrefix("192.168.1.0/24")
	uplinkSpace     = netip.MustParsePrefix("100.64.0.0/16")
)

// ErrNetemUnavailable was returned by SetLatency when it used netem. SetLatency
// now uses Shape's delay line, which needs no netem, and never returns it.
var ErrNetemUnavailable = errors.New("tc netem unavailable: the kernel lacks sch_netem")

// NewTopology builds the network that spec describes (see the address
// plan above). Everything is removed when t's cleanups run. It fails t if
// the spec is invalid or a step fails.
func NewTopology(t T, spec TopologySpec) *Topology {
	t.Helper()
	SkipShort(t)
	sweepStale(t)
	topo, err := newTopology(t, spec)
	if err != nil {
		t.Fatalf("testenv: build topology: %v", err)
	}
	return topo
}

func newTopology(t T, spec TopologySpec) (*Topology, error) {
	if err := spec.setDefaults(); err != nil {
		return nil, err
	}
	topo := &Topology{CloudLAN: spec.CloudLAN, t: t}

	r, err := newRouter(t, "cloud-router", spec.CloudLAN, cloudBridge)
	if err != nil {
		return nil, err
	}
	topo.Router = r
	for i, name := range spec.CloudHosts {
		h, err := attachHost(t, r, cloudBridge, fmt.Sprintf("c%d", i), name, name, spec.CloudLAN, i)
		if err != nil {
			return nil, err
		}
		topo.CloudHosts = append(topo.CloudHosts, h)
	}
	for i, ss := range spec.Sites {
		s, err := newSite(t, r, i, ss)
		if err != nil {
			return nil, fmt.Errorf("site %s: %w", ss.Name, err)
		}
		topo.Sites = append(topo.Sites, s)
	}
	return topo, nil
}

// setDefaults fills in default prefixes and checks the spec.
func (spec *TopologySpec) setDefaults() error {
	if !spec.CloudLAN.IsValid() {
		spec.CloudLAN = defaultCloudLAN
	}
	if err := checkLAN(spec.CloudLAN, len(spec.CloudHosts)); err != nil {
		return fmt.Errorf("cloud LAN: %w", err)
	}
	if spec.CloudLAN.Overlaps(uplinkSpace) {
		return fmt.Errorf("cloud LAN %s overlaps the uplinks' %s", spec.CloudLAN, uplinkSpace)
	}
	if len(spec.Sites) > 256 {
		return fmt.Errorf("%d sites; at most 256", len(spec.Sites))
	}
	if err := checkNames("cloud host", spec.CloudHosts); err != nil {
		return err
	}
	sites := make([]string, len(spec.Sites))
	for i := range spec.Sites {
		ss := &spec.Sites[i]
		sites[i] = ss.Name
		if !ss.LAN.IsValid() {
			ss.LAN = defaultSiteLAN
		}
		if err := checkLAN(ss.LAN, len(ss.Hosts)); err != nil {
			return fmt.Errorf("site %s: %w", ss.Name, err)
		}
		if ss.LAN.Overlaps(spec.CloudLAN) || ss.LAN.Overlaps(uplinkSpace) {
			return fmt.Errorf("site %s: LAN %s overlaps the cloud LAN %s or the uplinks' %s",
				ss.Name, ss.LAN, spec.CloudLAN, uplinkSpace)
		}
		if err := checkNames("host of site "+ss.Name, ss.Hosts); err != nil {
			return err
		}
	}
	return checkNames("site", sites)
}

// checkLAN checks that p is an IPv4 prefix with room for n hosts.
func checkLAN(p netip.Prefix, n int) error {
	if !p.Addr().Is4() {
		return fmt.Errorf("prefix %s: only IPv4 is supported", p)
	}
	if p != p.Masked() {
		return fmt.Errorf("prefix %s has host bits set", p)
	}
	if size := 1 << (32 - p.Bits()); firstHostNum+n >= size-1 {
		return fmt.Errorf("prefix %s has no room for %d hosts from .%d", p, n, firstHostNum)
	}
	return nil
}

// checkNames checks that names are non-empty and unique.
func checkNames(what string, names []string) error {
	seen := map[string]bool{}
	for _, n := range names {
		if n == "" {
			return fmt.Errorf("empty %s name", what)
		}
		if seen[n] {
			return fmt.Errorf("duplicate %s name %q", what, n)
		}
		seen[n] = true
	}
	return nil
}

// nthAddr returns the address n after p's first address.
func nthAddr(p netip.Prefix, n int) netip.Addr {
	a := p.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	v += uint32(n)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// ipSteps runs `ip -n ns` commands in order and stops at the first error.
func ipSteps(ns string, steps ...string) error {
	for _, s := range steps {
		args := append([]string{"-n", ns}, strings.Fields(s)...)
		if out, err := runIP(context.Background(), args...); err != nil {
			return fmt.Errorf("%w: %s", err, strings.TrimSpace(out))
		}
	}
	return nil
}

// newRouter makes a router namespace with forwarding on and a bridge
// holding the LAN's first address.
func newRouter(t T, label string, lan netip.Prefix, bridge string) (*Host, error) {
	r, err := newHost(t, label)
	if err != nil {
		return nil, err
	}
	r.Addr = nthAddr(lan, 1)
	err = ipSteps(r.Name,
		"link add "+bridge+" type bridge",
		fmt.Sprintf("addr add %s/%d dev %s", r.Addr, lan.Bits(), bridge),
		"link set "+bridge+" up",
	)
	if err != nil {
		return nil, fmt.Errorf("router %s: %w", r, err)
	}
	if err := r.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
		return nil, err
	}
	// Where br_netfilter is loaded, bridged frames would also cross the
	// router's IP hooks; keep the LAN a plain switch. Best effort: the
	// key exists only where the module is loaded.
	_ = r.Sysctl("net.bridge.bridge-nf-call-iptables", "0")
	return r, nil
}

// attachHost makes a host whose eth0 is linked to port on router r's
// bridge, with address .10+n on lan and a default route via the router.
func attachHost(t T, r *Host, bridge, port, label, nsLabel string, lan netip.Prefix, n int) (*Host, error) {
	h, err := newHost(t, nsLabel)
	if err != nil {
		return nil, err
	}
	h.Label = label
	h.Addr = nthAddr(lan, firstHostNum+n)
	err = ipSteps(r.Name,
		fmt.Sprintf("link add %s type veth peer name %s netns %s", port, hostIf, h.Name),
		fmt.Sprintf("link set %s master %s up", port, bridge),
	)
	if err == nil {
		err = ipSteps(h.Name,
			fmt.Sprintf("addr add %s/%d dev %s", h.Addr, lan.Bits(), hostIf),
			"link set "+hostIf+" up",
			fmt.Sprintf("route add default via %s", r.Addr),
		)
	}
	if err != nil {
		return nil, fmt.Errorf("host %s: %w", h, err)
	}
	return h, nil
}

// siteRules is the NAT router's ruleset: masquerade what leaves by the
// uplink, and let in from the uplink only replies to connections the site
// started.
const siteRules = `
table ip tt_site {}
delete table ip tt_site
table ip tt_site {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "wan0" masquerade
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		iifname "wan0" ct state established,related accept
		iifname "wan0" drop
	}
	chain input {
		type filter hook input priority filter; policy accept;
		iifname "wan0" ct state established,related accept
		iifname "wan0" drop
	}
}
`

// cutRules partitions the uplink: everything into or out of wan0 is
// dropped, before connection tracking lets established flows through.
const cutRules = `
table inet tt_cut {}
delete table inet tt_cut
table inet tt_cut {
	chain prerouting {
		type filter hook prerouting priority raw - 10; policy accept;
		iifname "wan0" drop
	}
	chain forward {
		type filter hook forward priority raw - 10; policy accept;
		oifname "wan0" drop
	}
	chain output {
		type filter hook output priority raw - 10; policy accept;
		oifname "wan0" drop
	}
}
`

// healRules removes cutRules (and does nothing if they are absent).
const healRules = `
table inet tt_cut {}
delete table inet tt_cut
`

// newSite builds site i: its router, linked to the cloud router r by an
// uplink, and its hosts.
func newSite(t T, cloud *Host, i int, spec SiteSpec) (*Site, error) {
	s := &Site{Name: spec.Name, LAN: spec.LAN, t: t, cloud: cloud, uplink: fmt.Sprintf("s%d", i)}
	r, err := newRouter(t, spec.Name+"-router", spec.LAN, siteBridge)
	if err != nil {
		return nil, err
	}
	s.router = r

	up := netip.PrefixFrom(nthAddr(uplinkSpace, i<<8), 24)
	cloudEnd := nthAddr(up, 1)
	s.PublicAddr = nthAddr(up, 2)
	err = ipSteps(cloud.Name,
		fmt.Sprintf("link add %s type veth peer name %s netns %s", s.uplink, siteUplink, r.Name),
		fmt.Sprintf("addr add %s/24 dev %s", cloudEnd, s.uplink),
		"link set "+s.uplink+" up",
	)
	if err == nil {
		err = ipSteps(r.Name,
			fmt.Sprintf("addr add %s/24 dev %s", s.PublicAddr, siteUplink),
			"link set "+siteUplink+" up",
			"route add default via "+cloudEnd.String(),
		)
	}
	if err != nil {
		return nil, fmt.Errorf("uplink: %w", err)
	}
	if _, err := r.runInput([]byte(siteRules), "nft", "-f", "-"); err != nil {
		return nil, fmt.Errorf("NAT rules: %w", err)
	}
	for j, name := range spec.Hosts {
		h, err := attachHost(t, r, siteBridge, fmt.Sprintf("h%d", j), name, spec.Name+"-"+name, spec.LAN, j)
		if err != nil {
			return nil, err
		}
		s.Hosts = append(s.Hosts, h)
	}
	return s, nil
}

// Cloud returns the cloud host with that name; it fails the test if there
// is none.
func (topo *Topology) Cloud(name string) *Host {
	topo.t.Helper()
	for _, h := range topo.CloudHosts {
		if h.Label == name {
			return h
		}
	}
	topo.t.Fatalf("testenv: no cloud host %q in the topology", name)
	return nil
}

// Site returns the site with that name; it fails the test if there is
// none.
func (topo *Topology) Site(name string) *Site {
	topo.t.Helper()
	for _, s := range topo.Sites {
		if s.Name == name {
			return s
		}
	}
	topo.t.Fatalf("testenv: no site %q in the topology", name)
	return nil
}

// Host returns the site's host with that name; it fails the test if there
// is none.
func (s *Site) Host(name string) *Host {
	s.t.Helper()
	for _, h := range s.Hosts {
		if h.Label == name {
			return h
		}
	}
	s.t.Fatalf("testenv: no host %q in site %s", name, s.Name)
	return nil
}

// Router returns the site's NAT router. Its Addr is its LAN address (the
// hosts' gateway); PublicAddr is its uplink address.
func (s *Site) Router() *Host { return s.router }

// Cut partitions the site from the cloud: the site router drops every
// packet into or out of its uplink, its own included, ahead of connection
// tracking. The site's LAN keeps working. New connections to the cloud
// time out (no error comes back, as with a real outage). Existing flows
// stall at once in both directions: nothing gets through, but nothing
// resets them either, so endpoints notice through their own timeouts and
// keepalives (TCP retransmission, QUIC idle timeout). NAT state is kept:
// after Heal, flows that have not timed out resume. Cut fails the test
// if the rules cannot be applied; cutting a cut site is a no-op.
func (s *Site) Cut() {
	s.t.Helper()
	if _, err := s.router.runInput([]byte(cutRules), "nft", "-f", "-"); err != nil {
		s.t.Fatalf("testenv: cut site %s: %v", s.Name, err)
	}
}

// Heal ends a Cut; healing a site that is not cut is a no-op.
func (s *Site) Heal() {
	s.t.Helper()
	if _, err := s.router.runInput([]byte(healRules), "nft", "-f", "-"); err != nil {
		s.t.Fatalf("testenv: heal site %s: %v", s.Name, err)
	}
}

// SetLatency delays every packet crossing the site's uplink by d, in each
// direction (so round trips to the cloud grow by 2d), keeping the rest of
// the link's shaping: it is Shape with the current Link's Delay set to d.
// Zero removes the delay.
func (s *Site) SetLatency(d time.Duration) error {
	l := s.Link()
	l.Delay = d
	return s.Shape(l)
}
