package gateway

import (
	"os"

	"github.com/tether-edge/tether/internal/component"
	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/version"
)

// Status returns what /status serves: this replica, and what its parts
// report (parts.go): its edges, the edge nodes and the refused addresses.
func (g *Gateway) Status() statusapi.Gateway {
	host, _ := os.Hostname()
	st := statusapi.Gateway{
		Replica:  g.replica,
		Hostname: host,
		Version:  version.Version,
		Started:  g.started,
		Mode:     g.cfg.Mode,
		Edges:    []statusapi.ConnectedEdge{},
	}
	if err := g.Ready(); err != nil {
		st.NotReady = err.Error()
	} else {
		st.Ready = true
	}
	component.Status(&g.parts, &st)
	return st
}
