package gateway

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/gateway/internal/edgetest"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// TestShutdownOrder: the shutdown order of New's parts. When Run's
// context ends, the proxy stops accepting at once while the tunnel server
// drains an open stream (which keeps working), and the admin server still
// answers, /readyz with 503; once the stream is done the tunnels are
// closed with CloseShutdown, and the admin server stops last.
func TestShutdownOrder(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	cfg, ca := testConfig(t, cp.AdminKubeconfig)
	// Longer than the test: the drain ends when the test releases the
	// stream.
	cfg.ShutdownGrace = metav1.Duration{Duration: 2 * time.Minute}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Ready(); err == nil {
		t.Error("ready before Run")
	}
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	admin := "http://" + g.AdminAddr().String()
	testenv.Eventually(t, "/readyz answers ok", func() bool { return httpGet(t, admin+"/readyz") == "ok\n" })

	kp, err := ca.NodeCert("edge-1")
	if err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	edge, err := edgetest.Dial(dctx, g.TunnelAddr().String(), edgetest.Options{Cert: kp.TLS, Roots: ca.Pool(), ServerName: "gateway"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(edge.Close)
	testenv.Eventually(t, "edge-1 registered", func() bool { _, ok := g.registry.Lookup("edge-1"); return ok })
	s := openEcho(t, g, "edge-1")
	t.Cleanup(s.close) // before Run's, if the test fails with s open
	s.roundTrip("before the shutdown")

	cancel()
	testenv.Eventually(t, "/readyz answers 503, shutting down", func() bool {
		resp, err := http.Get(admin + "/readyz")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(b), "shutting down")
	})
	proxyAddr := net.JoinHostPort("127.0.0.1", portOf(g.ProxyAddr()))
	testenv.Eventually(t, "the proxy refuses connections", func() bool {
		c, err := net.Dial("tcp", proxyAddr)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	s.roundTrip("during the drain")
	if m := httpGet(t, admin+"/metrics"); !strings.Contains(m, "tether_gateway_edges_connected 1\n") {
		t.Error("/metrics does not answer during the drain, or lacks the edge")
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned %v with a stream open", err)
	default:
	}
	if _, closed := edge.CloseCode(); closed {
		t.Fatal("the tunnel was closed with a stream open")
	}

	s.close()
	select {
	case err := <-done:
		done <- nil
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return once the stream was done")
	}
	if code, ok := edge.WaitClosed(5 * time.Second); !ok || code != tunnel.CloseShutdown {
		t.Fatalf("edge closed with %v (by gateway: %v), want CloseShutdown", code, ok)
	}
	if resp, err := http.Get(admin + "/healthz"); err == nil {
		resp.Body.Close()
		t.Error("the admin server answers after Run returned")
	}
}
