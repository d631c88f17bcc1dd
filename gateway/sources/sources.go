// Package sources decides which clients may use the gateway's cloud-side
// listeners: the transparent listener (gateway/proxy) and the admin
// endpoints. Both are for the VPC: a cloud client dialling an edge node's
// kubelet, Prometheus, the kubelet's probes. Neither is for the edge sites,
// which reach the gateway's host too (they dial its tunnel port): a shop
// host that reached the transparent listener could name any other shop's
// node by TLS SNI or HTTP Host, and the admin endpoints list every edge
// with its NAT address.
//
// A client is admitted when its address lies in an allowed range
// (--allowed-sources, by default the ranges a VPC uses: RFC 1918, IPv6
// unique local, loopback) and is none of the edges': not in
// --edge-cidrs, not an address of an edge Node (nodewatch) nor in its
// routed pod range (--edge-pod-cidrs), not the
// address an edge's tunnel comes from (its NAT's public address, which
// every other host of that shop shares). The edges' addresses win over
// the allowed ranges, except loopback: an edge or Node on loopback runs on
// the gateway's own host. The host's own addresses are admitted too (a
// process of the host dialling an edge node is DNATed with the source
// address routing picked, which may be a public one); the kernel drops a
// packet from outside that claims one of them. The client address is the socket's remote address:
// DNAT (netrules' redirect) changes only the destination, so it is the
// client's own also for redirected connections.
//
// A refused connection is reset, counted by listener and reason
// (tether_gateway_source_refusals_total) and logged at most once per
// LogInterval per listener, with the count since the last line.
package sources

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/gateway/nodewatch"
)

// DefaultAllowed are the ranges a VPC uses: RFC 1918, IPv6 unique local
// addresses and loopback. The carrier-grade NAT range 100.64.0.0/10 is
// not among them: edge sites' uplinks use it.
var DefaultAllowed = []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8", "fc00::/7", "::1/128"}

// Refusal reasons.
const (
	ReasonNotAllowed = "not_allowed" // outside every allowed range
	ReasonEdgeRange  = "edge_range"  // in --edge-cidrs
	ReasonEdgeNode   = "edge_node"   // an address of an edge Node
	ReasonEdgeTunnel = "edge_tunnel" // where an edge's tunnel comes from
	ReasonEdgePod    = "edge_pod"    // in an edge Node's routed pod range
)

// Reasons are the refusal reasons, for metrics.
var Reasons = []string{ReasonNotAllowed, ReasonEdgeRange, ReasonEdgeNode, ReasonEdgeTunnel, ReasonEdgePod}

// Defaults for Options.
const (
	// TunnelsMaxAge bounds how old the set of the edges' tunnel addresses
	// may be when a client is checked.
	TunnelsMaxAge = time.Second
	// LogInterval is the least time between two log lines about refused
	// clients of one listener.
	LogInterval = time.Minute
)

// Options configure a Filter.
type Options struct {
	// Allowed are the client ranges admitted; empty admits none.
	Allowed []netip.Prefix
	// Denied are ranges never admitted: the edge sites' (--edge-cidrs).
	Denied []netip.Prefix
	// Tunnels returns the addresses the edges' tunnels come from; nil
	// means none. It is called at most once per TunnelsMaxAge.
	Tunnels func() []netip.Addr
	// Local returns the host's own addresses, whose clients are the
	// host's processes (the kernel drops a packet from outside that
	// claims one); nil means none. Called with Tunnels.
	Local func() []netip.Addr
	// Logger receives the refusal lines; nil discards them.
	Logger *slog.Logger
	// Registerer, if set, gets the filter's metrics.
	Registerer prometheus.Registerer
}

// Filter admits or refuses clients. A nil *Filter admits every client.
type Filter struct {
	allowed []netip.Prefix
	denied  []netip.Prefix
	tunnels func() []netip.Addr
	local   func() []netip.Addr
	log     *slog.Logger
	metrics *metrics

	nodes atomic.Pointer[map[netip.Addr]struct{}] // edge Nodes' addresses
	pods  atomic.Pointer[nodewatch.PodRoutes]     // edge Nodes' routed pod ranges

	peersMu sync.Mutex // serializes refreshes of peers
	peers   atomic.Pointer[peerSet]

	logMu sync.Mutex
	logs  map[string]*logState // by listener
}

type peerSet struct {
	at    time.Time
	addrs map[netip.Addr]struct{} // the edges' tunnels'
	local map[netip.Addr]struct{} // the host's own
}

type logState struct {
	last       time.Time
	suppressed int
}

// ParsePrefixes parses CIDR prefixes (or bare addresses, as one-address
// prefixes) as a flag gives them.
func ParsePrefixes(flag string, items []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, s := range items {
		s = strings.TrimSpace(s)
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("--%s %q: %w", flag, s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// New returns a Filter.
func New(opts Options) (*Filter, error) {
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	f := &Filter{
		allowed: opts.Allowed,
		denied:  opts.Denied,
		tunnels: opts.Tunnels,
		local:   opts.Local,
		log:     opts.Logger,
		metrics: m,
		logs:    map[string]*logState{},
	}
	if f.log == nil {
		f.log = slog.New(slog.DiscardHandler)
	}
	return f, nil
}

// Update replaces the edge Nodes' addresses with those of snap. Give it to
// nodewatch.Watcher.Subscribe.
func (f *Filter) Update(snap *nodewatch.Snapshot) {
	addrs := map[netip.Addr]struct{}{}
	for _, n := range snap.Nodes {
		if !n.Edge {
			continue
		}
		for _, a := range n.InternalIPs {
			addrs[a.Unmap()] = struct{}{}
		}
		for _, a := range n.ExternalIPs {
			addrs[a.Unmap()] = struct{}{}
		}
	}
	f.nodes.Store(&addrs)
	f.pods.Store(snap.Pods)
}

// Check returns why a client at a is refused, or "" when it is admitted.
func (f *Filter) Check(a netip.Addr) string {
	if f == nil {
		return ""
	}
	a = a.Unmap()
	for _, p := range f.denied {
		if p.Contains(a) {
			return ReasonEdgeRange
		}
	}
	if a.IsLoopback() {
		// This host: an edge or a Node "at" loopback runs beside the
		// gateway, and the host's own clients are the VPC's.
		return f.allowedReason(a)
	}
	ps := f.peerSet()
	if _, ok := ps.local[a]; ok {
		return "" // a process of this host, on one of its addresses
	}
	if nodes := f.nodes.Load(); nodes != nil {
		if _, ok := (*nodes)[a]; ok {
			return ReasonEdgeNode
		}
	}
	if _, ok := ps.addrs[a]; ok {
		return ReasonEdgeTunnel
	}
	if _, _, ok := f.pods.Load().Owner(a); ok {
		return ReasonEdgePod
	}
	return f.allowedReason(a)
}

// allowedReason is "" if a is in an allowed range, else ReasonNotAllowed.
func (f *Filter) allowedReason(a netip.Addr) string {
	for _, p := range f.allowed {
		if p.Contains(a) {
			return ""
		}
	}
	return ReasonNotAllowed
}

// peerSet returns the edges' tunnel addresses and the host's own,
// refreshed when older than TunnelsMaxAge.
func (f *Filter) peerSet() *peerSet {
	if ps := f.peers.Load(); ps != nil && time.Since(ps.at) < TunnelsMaxAge {
		return ps
	}
	f.peersMu.Lock()
	defer f.peersMu.Unlock()
	if ps := f.peers.Load(); ps != nil && time.Since(ps.at) < TunnelsMaxAge {
		return ps
	}
	ps := &peerSet{at: time.Now(), addrs: map[netip.Addr]struct{}{}, local: map[netip.Addr]struct{}{}}
	if f.tunnels != nil {
		for _, a := range f.tunnels() {
			ps.addrs[a.Unmap()] = struct{}{}
		}
	}
	if f.local != nil {
		for _, a := range f.local() {
			ps.local[a.Unmap()] = struct{}{}
		}
	}
	f.peers.Store(ps)
	return ps
}

// Admit checks the client of a connection accepted by listener: when it
// is refused, Admit counts and (at a bounded rate) logs the refusal and
// returns its reason; the caller resets the connection. A client address
// that is not TCP or IP is refused as not allowed.
func (f *Filter) Admit(listener string, remote net.Addr) string {
	if f == nil {
		return ""
	}
	var a netip.Addr
	if ta, ok := remote.(*net.TCPAddr); ok {
		a = ta.AddrPort().Addr()
	}
	reason := ReasonNotAllowed
	if a.IsValid() {
		reason = f.Check(a)
	}
	if reason == "" {
		return ""
	}
	f.metrics.refusals.WithLabelValues(listener, reason).Inc()
	f.logRefusal(listener, remote, reason)
	return reason
}

// logRefusal logs a refused client unless a line for listener was logged
// less than LogInterval ago; the next line says how many it left out.
func (f *Filter) logRefusal(listener string, remote net.Addr, reason string) {
	f.logMu.Lock()
	st := f.logs[listener]
	if st == nil {
		st = &logState{}
		f.logs[listener] = st
	}
	now := time.Now()
	if !st.last.IsZero() && now.Sub(st.last) < LogInterval {
		st.suppressed++
		f.logMu.Unlock()
		return
	}
	suppressed := st.suppressed
	st.last, st.suppressed = now, 0
	f.logMu.Unlock()
	f.log.Warn("client refused: its address is not an allowed source (--allowed-sources) or is an edge's",
		"listener", listener, "client", remote.String(), "reason", reason, "refused_since_last_line", suppressed)
}

// Listen wraps ln so that Accept resets and skips the connections whose
// client the filter refuses. With a nil filter it returns ln.
func (f *Filter) Listen(ln net.Listener, listener string) net.Listener {
	if f == nil {
		return ln
	}
	return &filtered{Listener: ln, f: f, name: listener}
}

type filtered struct {
	net.Listener
	f    *Filter
	name string
}

func (l *filtered) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.f.Admit(l.name, c.RemoteAddr()) == "" {
			return c, nil
		}
		Reset(c)
	}
}

// Reset closes c with a TCP reset where it can: the client sees a refusal,
// not an empty answer.
func Reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// LocalAddrs returns the addresses of the host's interfaces, for
// Options.Local; none when they cannot be read.
func LocalAddrs() []netip.Addr {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(ipn.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}
