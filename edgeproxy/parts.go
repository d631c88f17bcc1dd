package edgeproxy

import (
	"context"
	"errors"
	"time"

	"github.com/tether-edge/tether/edgeproxy/edgetunnel"
	"github.com/tether-edge/tether/edgeproxy/identity"
	"github.com/tether-edge/tether/internal/component"
	"github.com/tether-edge/tether/internal/statusapi"
)

// tether-edge's parts, run by a component.Group (build): each says
// whether it is ready and fills its part of /status.

// part is a part made of functions.
type part = component.Func[statusapi.Edge]

// tunnelPart is the tunnel to the gateways: ready once connected to one,
// /status's gateways.
type tunnelPart struct{ *edgetunnel.Client }

var (
	_ component.Readier                  = tunnelPart{}
	_ component.Reporter[statusapi.Edge] = tunnelPart{}
)

func (tunnelPart) Name() string                      { return "tunnel" }
func (t tunnelPart) ReportStatus(st *statusapi.Edge) { st.Gateways = t.Status() }

// certificatesPart watches the client certificate files.
func certificatesPart(id *identity.Identity, interval time.Duration) component.Component {
	return part{N: "client-certificates", RunF: func(ctx context.Context) error {
		id.Watch(ctx, interval)
		return nil
	}}
}

// parts are the apiserver proxy's parts, in the order they start: the
// health checks of the apiservers, the proxy's listener, the replay of
// queued writes, the topology filter's informers and the node pool.
func (ap *apiserverProxy) parts() []component.Component {
	ps := []component.Component{
		part{N: "apiserver-upstreams", RunF: ap.upstreams.Run},
		part{N: "apiserver-proxy",
			RunF:   func(ctx context.Context) error { return ap.proxy.Serve(ctx, ap.ln) },
			ReadyF: ap.proxy.Ready,
			StatusF: func(st *statusapi.Edge) {
				as := ap.proxy.Status()
				as.Servers = ap.upstreams.Status()
				st.APIServer = &as
			},
			CloseF: func() error { return errors.Join(ap.ln.Close(), ap.store.Close()) },
		},
		part{N: "apiserver-replay", RunF: ap.proxy.Run},
	}
	if topo := ap.topology; topo != nil {
		ps = append(ps, part{N: "topology-filter", RunF: func(ctx context.Context) error {
			topo.Start(ctx)
			<-ctx.Done()
			topo.Shutdown()
			return nil
		}})
	}
	if ap.pods != nil {
		ps = append(ps, ap.pods.part(ap.proxy))
	}
	if pool := ap.pool; pool != nil {
		ps = append(ps, part{N: "pool",
			RunF:    func(ctx context.Context) error { return pool.Run(ctx, ap.ln.Addr()) },
			StatusF: func(st *statusapi.Edge) { st.Pool = pool.Status() },
			CloseF:  pool.Close,
		})
	}
	return ps
}

// part runs the informers of the tunnel's pods; until they sync the
// tunnel refuses pods (and still serves the node's own addresses).
func (p *tunnelPods) part() component.Component {
	return part{N: "tunnel-pods", RunF: func(ctx context.Context) error {
		p.src.Start(ctx)
		<-ctx.Done()
		p.src.Shutdown()
		return nil
	}}
}
