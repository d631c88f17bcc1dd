package e2e

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// gatewayStatus reads gw's /status.
func gatewayStatus(t *testing.T, gw *testenv.Host) statusapi.Gateway {
	t.Helper()
	body, err := world.Get(context.Background(), gw, world.GatewayAdmin(gw, "/status"))
	if err != nil {
		t.Fatalf("gateway /status: %v", err)
	}
	var st statusapi.Gateway
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("gateway /status: %v: %s", err, body)
	}
	return st
}

func connectedEdges(st statusapi.Gateway) []string {
	var names []string
	for _, e := range st.Edges {
		names = append(names, e.Node)
	}
	return names
}

// TestAllowList: a port the gateway redirects but the edge does not allow
// is refused by the edge with its reason, counted on both sides, and the
// kubelet's other port is never dialled.
func TestAllowList(t *testing.T) {
	w := newWorld(t, world.Options{}, "--netrules", "nftables", "--edge-ports", "10250,10255")
	e := w.Edges[0]
	ctx := context.Background()
	url := fmt.Sprintf("http://%s:10255/pods", e.Host.Addr)
	if out, err := w.Client.Command(ctx, "curl", "--silent", "--show-error", "--max-time", "5", url).CombinedOutput(); err == nil {
		t.Fatalf("curl %s succeeded through a port outside the edge's allow list: %s", url, out)
	}
	gw := w.Gateways[0]
	testenv.EventuallyWithin(t, 5*time.Second, "the refusal counted on the gateway", func() bool {
		m, err := world.Get(ctx, gw, world.GatewayAdmin(gw, "/metrics"))
		return err == nil &&
			world.Metric(m, `tether_gateway_proxy_refusals_total{reason="not_allowed"}`) == 1 &&
			world.Metric(m, fmt.Sprintf(`tether_gateway_edge_refusals_total{node=%q,reason="not_allowed"}`, e.Name)) == 1
	})
	m, err := world.Get(ctx, e.Host, world.EdgeAdmin("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	if v := world.Metric(m, `tether_edge_tunnel_streams_total{result="not_allowed"}`); v != 1 {
		t.Errorf("edge counted %v not_allowed streams, want 1", v)
	}
	// The allowed port still works.
	if err := reachable(w, e); err != nil {
		t.Errorf("allowed port after a refusal: %v", err)
	}
}

// TestIdentity: the gateway takes an edge's identity from its verified
// certificate only.
func TestIdentity(t *testing.T) {
	w := newWorld(t, world.Options{}, "--netrules", "nftables")
	gw := w.Gateways[0]
	ctx := context.Background()
	edge1, edge2 := w.Edges[0], w.Edges[1]

	t.Run("a certificate from another CA cannot register", func(t *testing.T) {
		rogueCA := testenv.MustCA(t, "not-the-cluster-ca")
		kp, err := rogueCA.NodeCert(edge2.Name)
		if err != nil {
			t.Fatal(err)
		}
		cert, key, err := kp.WriteFiles(t.TempDir(), "rogue")
		if err != nil {
			t.Fatal(err)
		}
		args := w.EdgeArgs(edge2)
		for i := range args {
			switch args[i] {
			case "--cert":
				args[i+1] = cert
			case "--key":
				args[i+1] = key
			}
		}
		cmd := edge2.Host.Start(t, w.Bins.Edge, append(args, "--admin-listen", "127.0.0.1:10367")...)
		testenv.EventuallyWithin(t, 10*time.Second, "the rogue edge to report its refusal", func() bool {
			body, err := world.Get(ctx, edge2.Host, "http://127.0.0.1:10367/status")
			var st statusapi.Edge
			if err != nil || json.Unmarshal([]byte(body), &st) != nil {
				return false
			}
			return len(st.Gateways) > 0 && !st.Gateways[0].Connected && st.Gateways[0].LastError != ""
		})
		if st := gatewayStatus(t, gw); len(st.Edges) != 2 {
			t.Errorf("gateway has edges %v, want only the two real ones", connectedEdges(st))
		}
		edge2.Host.Stop(cmd)
	})

	t.Run("no client certificate cannot register", func(t *testing.T) {
		pc, err := w.Client.ListenPacket("udp", ":0")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		tlsConf := tunnel.ClientTLS(func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }, w.GatewayCA.Pool(), gw.Label)
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		conn, err := quic.Dial(dctx, pc, &net.UDPAddr{IP: gw.Addr.AsSlice(), Port: world.TunnelPort}, tlsConf, tunnel.QUICConfig(tunnel.Limits{}))
		if err == nil {
			// TLS 1.3: the client may finish first; the gateway's verdict
			// then closes the connection.
			select {
			case <-conn.Context().Done():
			case <-time.After(5 * time.Second):
				t.Fatal("a tunnel without a client certificate stayed up")
			}
		}
		if st := gatewayStatus(t, gw); len(st.Edges) != 2 {
			t.Errorf("gateway has edges %v, want only the two real ones", connectedEdges(st))
		}
	})

	t.Run("node A's certificate never receives node B's traffic", func(t *testing.T) {
		// edge-2 goes away; a process in edge-2's site holding edge-1's
		// certificate connects. It registers as edge-1 (that is what its
		// certificate says), never as edge-2. The real edge-1 stops first:
		// otherwise the two take turns as edge-1 (newest wins, SECURITY.md)
		// and which one holds it when the test sends traffic is chance.
		for _, h := range []*testenv.Host{edge2.Host, edge1.Host} {
			if err := w.Stop(h); err != nil {
				t.Fatal(err)
			}
		}
		args := w.EdgeArgs(edge1)
		impostor := edge2.Host.Start(t, w.Bins.Edge, args...)
		testenv.EventuallyWithin(t, 10*time.Second, "the impostor's registration as edge-1", func() bool {
			for _, e := range gatewayStatus(t, gw).Edges {
				if e.Node == edge1.Name && strings.HasPrefix(e.Remote, edge2.Site.PublicAddr.String()+":") {
					return true
				}
			}
			return false
		})
		before := edge2.Kubelet.Requests.Load()
		if out, err := w.Curl(ctx, edge2.KubeletURL("/healthz"), "--max-time", "3"); err == nil {
			t.Fatalf("edge-2 reached with no edge-2 tunnel: %s", out)
		}
		if got := edge2.Kubelet.Requests.Load(); got != before {
			t.Errorf("edge-2's kubelet served %d requests meant for it through a tunnel of edge-1's identity", got-before)
		}
		m, err := world.Get(ctx, gw, world.GatewayAdmin(gw, "/metrics"))
		if err != nil {
			t.Fatal(err)
		}
		if v := world.Metric(m, `tether_gateway_proxy_refusals_total{reason="no_tunnel"}`); v < 1 {
			t.Errorf("no_tunnel refusals = %v, want at least 1", v)
		}
		// And edge-1's own traffic, now sent to the impostor, is refused
		// by it: edge-1's address is not its own.
		if out, err := w.Curl(ctx, edge1.KubeletURL("/healthz"), "--max-time", "3"); err == nil {
			t.Fatalf("the impostor relayed edge-1's traffic: %s", out)
		}
		edge2.Host.Stop(impostor)
	})
}

// TestTwoReplicas: an edge keeps a tunnel to every replica; when one
// stops, traffic through the other keeps flowing.
func TestTwoReplicas(t *testing.T) {
	w := newWorld(t, world.Options{Gateways: 2}, "--netrules", "nftables")
	gw1, gw2 := w.Gateways[0], w.Gateways[1]
	for _, gw := range w.Gateways {
		testenv.EventuallyWithin(t, 10*time.Second, "both edges on "+gw.Label, func() bool { return len(gatewayStatus(t, gw).Edges) == 2 })
	}
	if err := w.Stop(gw1); err != nil {
		t.Fatal(err)
	}
	// The VPC (or a load balancer) now sends the edge ranges to gw2.
	w.RouteSitesVia(t, gw2)
	for _, e := range w.Edges {
		if err := reachable(w, e); err != nil {
			t.Errorf("edge %s through the remaining replica: %v", e.Name, err)
		}
	}
	if st := gatewayStatus(t, gw2); len(st.Edges) != 2 {
		t.Errorf("remaining replica has edges %v", connectedEdges(st))
	}
}
