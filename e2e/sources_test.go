package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// TestShopReachesNoGatewayListener: a thief on a shop's LAN (here the
// opened edge host of site-a itself, whose connections leave through the
// site's NAT like every other shop host's) reaches the gateway's host,
// since the edges dial its tunnel port. With the shipped defaults it gets
// nothing else there: the transparent listener, asked by TLS SNI for
// ANOTHER site's node, resets it, and so do the admin endpoints (/status
// lists every edge and its NAT address), which listen on the host's VPC
// address as the shipped manifests bind them. The cloud client in the VPC
// still reaches both. The refusals are counted by listener.
func TestShopReachesNoGatewayListener(t *testing.T) {
	checkManifestsBindAdmin(t)
	w := newWorld(t, world.Options{}, "--netrules", "nftables")
	ctx := context.Background()
	gw := w.Gateways[0]
	thief, victim := w.Edges[0], w.Edges[1]
	if thief.Site == victim.Site {
		t.Fatal("the thief's and the victim's nodes are in one site")
	}

	// What a client sends to the transparent listener: a TLS connection
	// to the gateway's address whose SNI names a node.
	byName := func(h *testenv.Host) (string, error) {
		url := fmt.Sprintf("https://%s:%d/healthz", victim.Name, world.ProxyPort)
		out, err := h.Command(ctx, "curl", "--silent", "--show-error", "--fail", "--max-time", "10",
			"--cacert", w.Path("kubelet-ca.crt"), "--resolve", fmt.Sprintf("%s:%d:%s", victim.Name, world.ProxyPort, gw.Addr), url).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := byName(w.Client); err != nil || out != "ok "+victim.Name {
		t.Fatalf("the cloud client asking the transparent listener for %s: %q, %v", victim.Name, out, err)
	}
	if out, err := byName(thief.Host); err == nil {
		t.Errorf("from %s's LAN, the transparent listener relayed to %s's kubelet: %q", thief.Site.Name, victim.Name, out)
	}

	status := world.GatewayAdmin(gw, "/status")
	if _, err := world.Get(ctx, w.Client, status); err != nil {
		t.Fatalf("the cloud client reading %s: %v", status, err)
	}
	if body, err := world.Get(ctx, thief.Host, status); err == nil {
		t.Errorf("from %s's LAN, the gateway's /status answered: %.200s", thief.Site.Name, body)
	}

	// The gateway sees the thief at site-a's NAT address, where edge-1's
	// tunnel comes from: refused as an edge's (edge_tunnel), or as outside
	// the allowed ranges (not_allowed: 100.64.0.0/10 is not among the
	// defaults) while its set of tunnel addresses, re-read at most once a
	// second, predates edge-1's tunnel.
	metrics, err := world.Get(ctx, w.Client, world.GatewayAdmin(gw, "/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	for _, listener := range []string{"proxy", "admin"} {
		var n float64
		for _, reason := range []string{"edge_tunnel", "not_allowed"} {
			n += world.Metric(metrics, fmt.Sprintf(`tether_gateway_source_refusals_total{listener=%q,reason=%q}`, listener, reason))
		}
		if n < 1 {
			t.Errorf("tether_gateway_source_refusals_total{listener=%q} = %v, want at least 1", listener, n)
		}
	}
	if v := world.Metric(metrics, `tether_gateway_proxy_refusals_total{reason="source"}`); v < 1 {
		t.Errorf(`tether_gateway_proxy_refusals_total{reason="source"} = %v, want at least 1`, v)
	}
}

// checkManifestsBindAdmin: the shipped DaemonSet gives the admin endpoints
// the node's address (what the world gives the gateways: their VPC
// address), not every address, and widens no allowed source.
func checkManifestsBindAdmin(t *testing.T) {
	t.Helper()
	for _, f := range []string{"kubernetes/gateway.yaml", "helm/tether/templates/gateway.yaml"} {
		b, err := os.ReadFile(filepath.Join(world.RepoRoot(), "packaging", f))
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		if !strings.Contains(s, `"--admin-listen", "$(NODE_IP):`) {
			t.Errorf("packaging/%s does not bind --admin-listen to $(NODE_IP)", f)
		}
		for _, wide := range []string{`admin-listen: ":`, `"admin-listen" (printf ":`, "\n    allowed-sources:"} {
			if strings.Contains(s, wide) {
				t.Errorf("packaging/%s holds %q", f, wide)
			}
		}
	}
}
