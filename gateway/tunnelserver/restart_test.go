package tunnelserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/edgeproxy/edgetunnel"
	"github.com/tether-edge/tether/gateway/registry"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// A gateway killed and started again on the same port with the same key
// answers the liveness probe of an idle edge with a stateless reset: the
// edge reconnects because of the reset, not after its idle timeout.
func TestRestartedGatewayResetsIdleEdge(t *testing.T) {
	ca := testenv.MustCA(t, "tether test CA")
	kp, err := ca.ServerCert("gateway", "gateway")
	if err != nil {
		t.Fatal(err)
	}
	key, err := tunnel.StatelessResetKey(kp.TLS.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	// Keepalive 5 s (the default): the edge probes after about 6 s of
	// silence, 9 s before the 15 s idle timeout, room for a loaded
	// machine to run the probe late.
	limits := tunnel.Limits{IdleTimeout: 15 * time.Second}
	listen := func(addr string) (*Server, *registry.Registry, func() error) {
		t.Helper()
		reg := registry.New(registry.Options{})
		srv, err := Listen(addr, reg, Options{
			GetCertificate:    func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &kp.TLS, nil },
			ClientCAs:         ca.Pool(),
			StatelessResetKey: key,
			Limits:            limits,
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- srv.Serve(ctx) }()
		stop := func() error {
			cancel()
			return <-done
		}
		return srv, reg, stop
	}
	srv, reg, stop := listen("127.0.0.1:0")
	addr := srv.Addr().String()

	node, err := ca.NodeCert("edge-1")
	if err != nil {
		t.Fatal(err)
	}
	metrics := prometheus.NewRegistry()
	c, err := edgetunnel.New(edgetunnel.Options{
		Gateways:    []string{addr},
		ServerName:  "gateway",
		RootCAs:     func() *x509.CertPool { return ca.Pool() },
		Certificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &node.TLS, nil },
		AllowPorts:  []uint16{10250},
		Limits:      limits,
		Registry:    metrics,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-ran
	})
	testenv.Eventually(t, "edge-1 registered", func() bool { _, ok := reg.Lookup("edge-1"); return ok })
	first, _ := reg.Lookup("edge-1")
	// Wait until the connection is idle (the handshake's and path MTU
	// discovery's packets, long enough to draw a reset by themselves, are
	// over): the gateway has received nothing from the edge for a second.
	srv.mu.Lock()
	var conn *quic.Conn
	for c := range srv.live {
		conn = c
	}
	srv.mu.Unlock()
	last, quietSince := conn.ConnectionStats().PacketsReceived, time.Now()
	testenv.Eventually(t, "the edge's connection is idle", func() bool {
		if n := conn.ConnectionStats().PacketsReceived; n != last {
			last, quietSince = n, time.Now()
		}
		return time.Since(quietSince) >= time.Second
	})

	// Kill: the connections are dropped without a word to the edge and
	// the port freed. The socket goes first: closing the listener also
	// ends Serve, whose shutdown closes the live connections with a
	// CONNECTION_CLOSE, and on a busy machine that could reach the edge
	// before quic.Transport.Close destroyed them silently (the edge then
	// reconnected at once, closed_by_gateway, with no reset to notice).
	srv.udp.Close()
	srv.Close()
	if err := stop(); err == nil {
		t.Log("Serve of the killed gateway returned nil")
	}
	_, reg2, stop2 := listen(addr)
	t.Cleanup(func() {
		if err := stop2(); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	testenv.Eventually(t, "edge-1 registered again", func() bool { _, ok := reg2.Lookup("edge-1"); return ok })
	again, _ := reg2.Lookup("edge-1")
	if again == first {
		t.Fatal("the restarted gateway holds the old registration")
	}

	ends := func(reason string) float64 {
		return gathered(t, metrics, "tether_edge_tunnel_gateway_disconnects_total", "reason", reason)
	}
	if got := ends("stateless_reset"); got != 1 {
		t.Errorf("disconnects by stateless reset %v, want 1 (idle timeouts %v, closed by the gateway %v, other %v)",
			got, ends("idle_timeout"), ends("closed_by_gateway"), ends("other"))
	}
	if got := ends("idle_timeout"); got != 0 {
		t.Errorf("disconnects by idle timeout %v, want 0", got)
	}
	// Usually a probe drew the reset; a keepalive packet that happened to
	// carry a long ACK frame (over 42 bytes) may have drawn it first.
	t.Logf("liveness probes sent: %v", gathered(t, metrics, "tether_edge_tunnel_gateway_probes_total"))
}

// gathered is the value of the one series of name whose labels include
// the given name-value pairs.
func gathered(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					found = found || (lp.GetName() == labels[i] && lp.GetValue() == labels[i+1])
				}
				if !found {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	t.Fatal(errors.New("no series " + name))
	return 0
}
