package main

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-edge/tether/gateway/tunnelserver"
)

// An exposition as the gateway serves it, with series that are trouble,
// series that are not, and other metrics.
const exposition = `# HELP tether_gateway_tunnel_connections_total Tunnel connections by result.
# TYPE tether_gateway_tunnel_connections_total counter
tether_gateway_tunnel_connections_total{result="registered"} 10000
tether_gateway_tunnel_connections_total{result="unknown_ca"} 2
tether_gateway_tunnel_connections_total{result="expired"} 0
tether_gateway_edge_refusals_total{node="edge-1",reason="not_allowed"} 3
tether_gateway_edge_refusals_total{node="edge-2",reason="not_allowed"} 4
tether_gateway_edge_refusals_total{node="edge-2",reason="dial_failed"} 1
tether_gateway_tunnel_udp_drops_total 17
tether_gateway_tunnel_edge_streams_total{result="probe"} 40
tether_gateway_tunnel_edge_streams_total{result="aborted"} 5
tether_gateway_delegated_heartbeats_total{result="ok"} 12000
tether_gateway_delegated_heartbeats_total{result="not_in_pool"} 6
tether_gateway_proxy_connections_total{result="refused"} 9
go_goroutines 30077
`

func TestTroubles(t *testing.T) {
	got := troubles(exposition)
	want := map[string]float64{
		"connections{unknown_ca}":           2,
		"edge_refusals{not_allowed}":        7,
		"edge_refusals{dial_failed}":        1,
		"udp_drops":                         17,
		"edge_streams{aborted}":             5,
		"delegated_heartbeats{not_in_pool}": 6,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("troubles (-want +got):\n%s", d)
	}
}

func TestLogIssues(t *testing.T) {
	log := strings.Join([]string{
		`time=2026-11-28T12:55:17.317Z level=INFO msg="edge connected" node=edge-1`,
		`time=2026-11-28T12:55:18.000Z level=WARN msg="closing tunnels with streams still open" err="context deadline exceeded"`,
		`time=2026-11-28T12:55:19.000Z level=WARN msg="closing tunnels with streams still open" err="context deadline exceeded"`,
		`time=2026-11-28T12:55:20.000Z level=ERROR msg=apply err="netlink: permission denied"`,
		`a line of another process`,
	}, "\n")
	got := logIssues(strings.Split(log, "\n"))
	want := map[string]int{"closing tunnels with streams still open": 2, "apply": 1}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("log issues (-want +got):\n%s", d)
	}
}

// TestUnexpected: what a phase causes by design is not held against it;
// anything else, and any WARN or ERROR line, is.
func TestUnexpected(t *testing.T) {
	cold := healthMark{phase: "cold", added: map[string]float64{"udp_drops": 3, "edge_streams{aborted}": 2, "handshakes_shed": 900},
		logAdded: map[string]int{tunnelserver.ShedMessage: 2}}
	if u := cold.unexpected(); len(u) != 0 {
		t.Errorf("cold start: %v, want nothing unexpected", u)
	}
	steady := healthMark{phase: "steady", added: map[string]float64{"udp_drops": 3}, logAdded: map[string]int{"apply": 1, tunnelserver.ShedMessage: 1}}
	want := []string{"udp_drops +3", `log "apply" ×1`, logKey(tunnelserver.ShedMessage) + " ×1"}
	if d := cmp.Diff(want, steady.unexpected()); d != "" {
		t.Errorf("steady (-want +got):\n%s", d)
	}
}
