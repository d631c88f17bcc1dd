package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// TestReconnectLoop: a valid node key (edge-1's, next to the real edge-1)
// opens tunnel after tunnel to the real gateway. Promise (SECURITY.md):
// the node's registration is replaced at most 10 times in a row, one more
// every 6 s; every connection beyond is closed with CloseReplaced and
// counted, and the gateway keeps a tunnel for the node throughout.
func TestReconnectLoop(t *testing.T) {
	w := newWorld(t, world.Options{}, "--netrules", "nftables")
	gw, edge := w.Gateways[0], w.Edges[0]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kp, err := w.ClusterCA.NodeCert(edge.Name)
	if err != nil {
		t.Fatal(err)
	}
	replaced := func() float64 {
		return gatewayMetric(t, gw, `tether_gateway_edge_registrations_total{result="replaced"}`)
	}
	refused := func() float64 {
		return gatewayMetric(t, gw, `tether_gateway_tunnel_connections_total{result="too_often"}`)
	}
	replacedBefore, refusedBefore := replaced(), refused()

	const loops = 40
	start := time.Now()
	for range loops {
		conn, err := dialTunnel(ctx, edge.Host, gw, kp.TLS, w.GatewayCA.Pool())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.CloseWithError(tunnel.CloseNormal, "")
	}
	var gotReplaced, gotRefused float64
	testenv.Eventually(t, "the gateway to register or refuse every connection", func() bool {
		gotReplaced, gotRefused = replaced()-replacedBefore, refused()-refusedBefore
		return gotReplaced+gotRefused >= loops
	})
	took := time.Since(start)
	// The real edge's own reconnections draw on the same budget.
	bound := float64(10 + 1 + int(took/(6*time.Second)))
	t.Logf("%d connections in %v: %v replacements, %v refused too_often", loops, took.Round(time.Millisecond), gotReplaced, gotRefused)
	if gotReplaced > bound {
		t.Errorf("%v replacements in %v, want at most %v", gotReplaced, took.Round(time.Millisecond), bound)
	}
	if gotRefused < loops-bound {
		t.Errorf("%v connections refused too_often, want at least %v", gotRefused, loops-bound)
	}
	testenv.Eventually(t, "a tunnel for "+edge.Name, func() bool {
		for _, n := range connectedEdges(gatewayStatus(t, gw)) {
			if n == edge.Name {
				return true
			}
		}
		return false
	})
}
