package gateway

import (
	"os"
	"time"

	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/version"
)

// Status is what /status serves: this replica and its edges.
type Status struct {
	Replica  string    `json:"replica"`
	Hostname string    `json:"hostname"`
	Version  string    `json:"version"`
	Started  time.Time `json:"started"`
	Mode     string    `json:"mode"`
	Ready    bool      `json:"ready"`
	// NotReady says why Ready is false.
	NotReady string `json:"notReady,omitempty"`
	// EdgeNodes counts the edge nodes in the cluster, connected or not.
	EdgeNodes int          `json:"edgeNodes"`
	Edges     []EdgeStatus `json:"edges"`
	// AddressRefusals are the addresses edge nodes claim that this replica
	// does not route to them, with the reason (nodewatch.Resolve).
	AddressRefusals []nodewatch.Refusal `json:"addressRefusals,omitempty"`
}

// EdgeStatus is one connected edge.
type EdgeStatus struct {
	Node string `json:"node"`
	// Pool is the node's pool label; empty when the node has none or is
	// not (yet) known from the cluster.
	Pool           string           `json:"pool,omitempty"`
	Remote         string           `json:"remote"`
	ConnectedSince time.Time        `json:"connectedSince"`
	RTTMillis      float64          `json:"rttMs"`
	Streams        int64            `json:"streams"`
	BytesUp        int64            `json:"bytesUp"`   // toward the edge
	BytesDown      int64            `json:"bytesDown"` // from the edge
	Refusals       map[string]int64 `json:"refusals,omitempty"`
}

// Status returns the current status.
func (g *Gateway) Status() Status {
	host, _ := os.Hostname()
	snap := g.watcher.Snapshot()
	st := Status{
		Replica:   g.replica,
		Hostname:  host,
		Version:   version.Version,
		Started:   g.started,
		Mode:      g.cfg.Mode,
		EdgeNodes: snap.Edge(),
		Edges:     []EdgeStatus{},

		AddressRefusals: snap.Routing(nodewatch.Mode(g.cfg.Mode)).Refused(),
	}
	if err := g.Ready(); err != nil {
		st.NotReady = err.Error()
	} else {
		st.Ready = true
	}
	for _, e := range g.registry.Edges() {
		n, _ := snap.Lookup(e.Node)
		st.Edges = append(st.Edges, EdgeStatus{
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
	return st
}
