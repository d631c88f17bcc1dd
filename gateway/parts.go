package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/admin"
	"github.com/tether-edge/tether/internal/component"
	"github.com/tether-edge/tether/internal/statusapi"
)

// tether-gateway's parts, run by a component.Group (New says in which
// order): each says whether it is ready and fills its part of /status.
// The delegated-heartbeat and election handlers are not parts: the tunnel
// server serves them; the informers they read are.

// part is a part made of functions.
type part = component.Func[statusapi.Gateway]

// watcherPart is the node watcher: ready once its informer has synced
// (its first snapshot is published); /status's edge nodes and the
// addresses routing refused.
func (g *Gateway) watcherPart() component.Component {
	return part{N: "node-watcher", RunF: g.watcher.Run,
		ReadyF: func() error {
			if g.watcher.Snapshot().Version == 0 {
				return errors.New("node informer not synced")
			}
			return nil
		},
		StatusF: func(st *statusapi.Gateway) {
			snap := g.watcher.Snapshot()
			st.EdgeNodes = snap.Edge()
			// The refusals as routing decided them (nodewatch.Resolve).
			for _, r := range snap.Routing(nodewatch.Mode(g.cfg.Mode)).Refused() {
				st.AddressRefusals = append(st.AddressRefusals,
					statusapi.AddressRefusal{Addr: r.Addr, Node: r.Node, Reason: string(r.Reason), Holder: r.Holder})
			}
			for _, r := range snap.Pods.Refused() {
				st.PodRangeRefusals = append(st.PodRangeRefusals,
					statusapi.PodRangeRefusal{Prefix: r.Prefix, Node: r.Node, Reason: string(r.Reason), With: r.With})
			}
		},
	}
}

// retiredPart reads the retired node identities (internal/retired): ready
// once read. Each change, the first read included, closes the tunnels of
// the certificates it retires (tunnelserver.Server.CloseRetired).
func (g *Gateway) retiredPart() component.Component {
	return part{N: "retired-nodes", RunF: g.retired.Run,
		ReadyF: func() error {
			if !g.retired.HasSynced() {
				return errors.New("retired nodes not read")
			}
			return nil
		},
	}
}

// tunnelPart is the QUIC tunnel server: when stopped it closes its
// listener, lets open streams drain for --shutdown-grace and closes the
// tunnels with tunnel.CloseShutdown; /status's edges, with their pools
// from the node watcher.
func (g *Gateway) tunnelPart() component.Component {
	return part{N: "tunnel-server", RunF: g.tunnels.Serve, CloseF: g.tunnels.Close,
		StatusF: func(st *statusapi.Gateway) {
			snap := g.watcher.Snapshot()
			for _, e := range g.registry.Edges() {
				n, _ := snap.Lookup(e.Node)
				st.Edges = append(st.Edges, statusapi.ConnectedEdge{
					Node:           e.Node,
					Pool:           n.Pool,
					Remote:         e.Remote,
					ConnectedSince: e.ConnectedSince,
					RTTMillis:      float64(e.RTT.Microseconds()) / 1000,
					Streams:        e.Streams,
					BytesUp:        e.BytesUp,
					BytesDown:      e.BytesDown,
					Refusals:       e.Refusals,
				})
			}
		},
	}
}

// proxyPart is the transparent proxy on --proxy-port: when stopped it
// stops accepting and returns once its connections have ended (at the
// latest when the tunnel server closes the tunnels).
func (g *Gateway) proxyPart() component.Component {
	return part{N: "proxy", RunF: func(ctx context.Context) error { return g.proxy.Serve(ctx, g.proxyLn) }, CloseF: g.proxyLn.Close}
}

// dnatPart programs the DNAT rules: ready once they are applied; when
// stopped it removes them with --cleanup-on-exit.
func (g *Gateway) dnatPart() component.Component {
	return part{N: "dnat", RunF: g.dnat.Run, ReadyF: func() error {
		if !g.dnat.Ready() {
			return errors.New("DNAT rules not applied yet")
		}
		return nil
	}}
}

// dnsPart serves node names over DNS, on the sockets in g.dnsPC and
// g.dnsLn when Run starts.
func (g *Gateway) dnsPart() component.Component {
	return part{N: "dns",
		RunF:   func(ctx context.Context) error { return g.dns.Serve(ctx, g.dnsPC, g.dnsLn) },
		CloseF: func() error { return errors.Join(g.dnsPC.Close(), g.dnsLn.Close()) },
	}
}

// certParts renew the serving certificate: the self-managed CA, or the
// ACME manager, ready once it has a certificate (its HTTP-01 challenge
// server is acmeHTTPPart).
func (g *Gateway) certParts() []component.Component {
	if ca := g.certs.ca; ca != nil {
		return []component.Component{part{N: "self-managed-ca", RunF: ca.Run}}
	}
	if m := g.certs.acme; m != nil {
		return []component.Component{part{N: "acme", RunF: m.Run, ReadyF: m.Ready}}
	}
	return nil
}

// acmeHTTPPart answers the ACME HTTP-01 challenges on g.acmeLn, bound
// before the ACME manager is made.
func (g *Gateway) acmeHTTPPart() component.Component {
	return part{N: "acme-http", CloseF: g.acmeLn.Close, RunF: func(ctx context.Context) error {
		return admin.ServeListener(ctx, g.acmeLn, g.certs.acme.HTTPHandler())
	}}
}

// adminPart serves the admin endpoints and GET /ca.crt on g.adminLn:
// readiness and /status come from the parts. It stops the gateway if it
// fails.
func (g *Gateway) adminPart() component.Component {
	mux := http.NewServeMux()
	mux.Handle("/", admin.New(admin.Options{Registry: g.metrics, Ready: g.Ready, Status: func() any { return g.Status() }, Profiling: g.cfg.Profiling, Logger: g.log}))
	mux.HandleFunc("GET /ca.crt", g.certs.serveCA)
	return part{N: "admin", CloseF: g.adminLn.Close, RunF: func(ctx context.Context) error {
		err := admin.ServeListener(ctx, g.adminLn, mux)
		if ctx.Err() == nil {
			err = fmt.Errorf("admin server stopped: %w", errors.Join(err, http.ErrServerClosed))
		}
		return err
	}}
}

// shutdownLog logs that the gateway is shutting down, and why, as the
// group starts to stop.
func (g *Gateway) shutdownLog() component.Component {
	return part{N: "shutdown-log", RunF: func(ctx context.Context) error {
		<-ctx.Done()
		g.log.Info("tether-gateway shutting down", "reason", context.Cause(ctx))
		return nil
	}}
}
