package gateway

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/tether-edge/tether/gateway/sources"
	"github.com/tether-edge/tether/internal/accept"
)

// listenRetrying binds addr for one of the gateway's HTTP servers (admin,
// ACME HTTP-01; what names it in an error) and wraps the listener
// (retrying).
func (g *Gateway) listenRetrying(name, addr, what string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	rln, err := g.retrying(name, ln)
	if err != nil {
		ln.Close()
		return nil, err
	}
	return rln, nil
}

// retrying wraps ln, the listener of one of the gateway's HTTP servers
// (admin, ACME HTTP-01), so that a failed accept (EMFILE and the like) is
// retried after a backoff, logged once per streak and counted as
// tether_gateway_accept_errors_total{listener=name}: the server then ends
// only when it is shut down, never the gateway with it. The proxy and the
// DNS server wrap their own listeners the same way. The QUIC tunnel
// listener needs nothing of the kind: its one UDP socket takes no file
// descriptor per edge, quic-go retries temporary read errors itself, and
// its Accept fails only once the listener is closed.
func (g *Gateway) retrying(name string, ln net.Listener) (net.Listener, error) {
	errs, err := accept.Counter(g.metrics, "tether_gateway_accept_errors_total", name)
	if err != nil {
		return nil, err
	}
	return accept.Listen(ln, accept.Options{Name: name, Logger: g.log, Errors: errs}), nil
}

// newSources makes the filter of the clients the transparent listener and
// the admin endpoints accept (--allowed-sources, never an edge's address)
// and subscribes it to the node watcher.
func (g *Gateway) newSources() (*sources.Filter, error) {
	allowed, err := sources.ParsePrefixes("allowed-sources", g.cfg.AllowedSources)
	if err != nil {
		return nil, err
	}
	denied, err := g.cfg.edgeCIDRs()
	if err != nil {
		return nil, err
	}
	f, err := sources.New(sources.Options{
		Allowed:    allowed,
		Denied:     denied,
		Tunnels:    g.tunnelPeers,
		Local:      sources.LocalAddrs,
		Logger:     g.log,
		Registerer: g.metrics,
	})
	if err != nil {
		return nil, err
	}
	g.watcher.Subscribe(f.Update)
	return f, nil
}

// tunnelPeers are the addresses the edges' tunnels come from: their NATs'
// public addresses, which the other hosts of their sites share.
func (g *Gateway) tunnelPeers() []netip.Addr {
	var out []netip.Addr
	for _, e := range g.registry.Edges() {
		if ap, err := netip.ParseAddrPort(e.Remote); err == nil {
			out = append(out, ap.Addr())
		}
	}
	return out
}
