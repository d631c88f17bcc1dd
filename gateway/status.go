package gateway

import (
	"os"

	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/version"
)

// Status returns what /status serves: this replica and its edges.
func (g *Gateway) Status() statusapi.Gateway {
	host, _ := os.Hostname()
	snap := g.watcher.Snapshot()
	st := statusapi.Gateway{
		Replica:   g.replica,
		Hostname:  host,
		Version:   version.Version,
		Started:   g.started,
		Mode:      g.cfg.Mode,
		EdgeNodes: snap.Edge(),
		Edges:     []statusapi.ConnectedEdge{},
	}
	if err := g.Ready(); err != nil {
		st.NotReady = err.Error()
	} else {
		st.Ready = true
	}
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
	// The refusals as routing decided them (nodewatch.Resolve).
	for _, r := range snap.Routing(nodewatch.Mode(g.cfg.Mode)).Refused() {
		st.AddressRefusals = append(st.AddressRefusals,
			statusapi.AddressRefusal{Addr: r.Addr, Node: r.Node, Reason: string(r.Reason), Holder: r.Holder})
	}
	return st
}
