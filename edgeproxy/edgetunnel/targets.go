package edgetunnel

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// DefaultGatewayPort is the gateway's QUIC port, used when a --gateway
// entry names none.
const DefaultGatewayPort = 10262

// Resolver looks up the addresses of a gateway name; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

var _ Resolver = (*net.Resolver)(nil)

// Target is one --gateway entry: an address or a DNS name that resolves to
// every gateway replica, with the port the replicas listen on.
type Target struct {
	Host string // IP literal or DNS name, without brackets
	Port uint16
}

func (t Target) String() string { return net.JoinHostPort(t.Host, strconv.Itoa(int(t.Port))) }

// ParseTargets parses --gateway entries: host:port, [v6]:port, or a bare
// host or address (port DefaultGatewayPort).
func ParseTargets(entries []string) ([]Target, error) {
	if len(entries) == 0 {
		return nil, errors.New("no gateway given")
	}
	var ts []Target
	for _, e := range entries {
		t, err := parseTarget(e)
		if err != nil {
			return nil, err
		}
		ts = append(ts, t)
	}
	return ts, nil
}

func parseTarget(e string) (Target, error) {
	host, port, err := net.SplitHostPort(e)
	if err != nil {
		// No port: a bare name, address or [v6] literal.
		host, port = e, strconv.Itoa(DefaultGatewayPort)
		if v6, ok := strings.CutPrefix(e, "["); ok {
			host, ok = strings.CutSuffix(v6, "]")
			if !ok || !isIP(host) {
				return Target{}, fmt.Errorf("gateway %q: want host, host:port or [ipv6]:port", e)
			}
		}
		if strings.ContainsAny(host, "[]") || (strings.Contains(host, ":") && !isIP(host)) {
			return Target{}, fmt.Errorf("gateway %q: want host, host:port or [ipv6]:port", e)
		}
	}
	if host == "" {
		return Target{}, fmt.Errorf("gateway %q: empty host", e)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return Target{}, fmt.Errorf("gateway %q: bad port %q", e, port)
	}
	return Target{Host: host, Port: uint16(p)}, nil
}

func isIP(s string) bool { _, err := netip.ParseAddr(s); return err == nil }

// endpoint is one gateway replica: a resolved address, with the name its
// certificate is checked against.
type endpoint struct {
	addr       netip.AddrPort
	serverName string
	target     Target
}

const lookupTimeout = 10 * time.Second

// resolve turns the targets into endpoints. A name that fails to resolve
// keeps the endpoints it had in prev (a DNS hiccup must not drop working
// connections); its error is returned alongside the result.
func resolve(ctx context.Context, r Resolver, targets []Target, serverName string, prev map[netip.AddrPort]endpoint) (map[netip.AddrPort]endpoint, error) {
	out := make(map[netip.AddrPort]endpoint)
	add := func(ep endpoint) {
		if _, dup := out[ep.addr]; !dup { // first entry naming an address wins
			out[ep.addr] = ep
		}
	}
	var errs []error
	for _, t := range targets {
		sn := serverName
		if sn == "" {
			sn = t.Host
		}
		if a, err := netip.ParseAddr(t.Host); err == nil {
			add(endpoint{addr: netip.AddrPortFrom(a.Unmap(), t.Port), serverName: sn, target: t})
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		addrs, err := r.LookupNetIP(lctx, "ip", t.Host)
		cancel()
		if err == nil && len(addrs) == 0 {
			err = errors.New("no addresses")
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("resolve gateway %s: %w", t.Host, err))
			for _, ep := range prev {
				if ep.target == t {
					add(ep)
				}
			}
			continue
		}
		for _, a := range addrs {
			add(endpoint{addr: netip.AddrPortFrom(a.Unmap(), t.Port), serverName: sn, target: t})
		}
	}
	return out, errors.Join(errs...)
}
