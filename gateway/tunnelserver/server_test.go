package tunnelserver

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/gateway/internal/edgetest"
	"github.com/tether-edge/tether/gateway/internal/metrictest"
	"github.com/tether-edge/tether/gateway/registry"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

type fixture struct {
	t      *testing.T
	ca     *testenv.CA
	reg    *registry.Registry
	srv    *Server
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, grace time.Duration) *fixture {
	t.Helper()
	return startWith(t, func(o *Options) { o.ShutdownGrace = grace })
}

// startWith starts a server whose options edit may change.
func startWith(t *testing.T, edit func(*Options)) *fixture {
	t.Helper()
	ca := testenv.MustCA(t, "tether test CA")
	kp, err := ca.ServerCert("gateway", "gateway")
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.New(registry.Options{})
	opts := Options{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &kp.TLS, nil },
		ClientCAs:      ca.Pool(),
		Registerer:     prometheus.NewRegistry(),
	}
	edit(&opts)
	srv, err := Listen("127.0.0.1:0", reg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	f := &fixture{t: t, ca: ca, reg: reg, srv: srv, cancel: cancel, done: make(chan error, 1)}
	go func() { f.done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-f.done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return f
}

func (f *fixture) dial(cert tls.Certificate, roots *testenv.CA) (*edgetest.Edge, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := edgetest.Dial(ctx, f.srv.Addr().String(), edgetest.Options{
		Cert: cert, Roots: roots.Pool(), ServerName: "gateway",
	})
	if err == nil {
		f.t.Cleanup(e.Close)
	}
	return e, err
}

// node connects a test edge with a certificate for node and waits until it
// is registered.
func (f *fixture) node(node string) *edgetest.Edge {
	f.t.Helper()
	kp, err := f.ca.NodeCert(node)
	if err != nil {
		f.t.Fatal(err)
	}
	edge, err := f.dial(kp.TLS, f.ca)
	if err != nil {
		f.t.Fatal(err)
	}
	eventually(f.t, node+" is registered", func() bool { _, ok := f.reg.Lookup(node); return ok })
	return edge
}

func (f *fixture) counter(result string) float64 {
	f.t.Helper()
	v, err := metrictest.Value(f.srv.conns, "tether_gateway_tunnel_connections_total", "result="+result)
	if err != nil {
		f.t.Fatal(err)
	}
	return v
}

// eventually polls cond for up to five seconds.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestAcceptsNodeCertificate(t *testing.T) {
	f := start(t, 0)
	edge := f.node("edge-1")
	if got := f.counter(resultRegistered); got != 1 {
		t.Fatalf("registered counter %v, want 1", got)
	}

	// The edge may not open streams toward the gateway.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := edge.Conn().OpenStreamSync(ctx); err == nil {
		t.Fatal("the edge opened a stream toward the gateway")
	}

	edge.Close()
	eventually(t, "edge-1 is unregistered", func() bool { return f.reg.Len() == 0 })
}

func TestRefusesNonNodeCertificate(t *testing.T) {
	f := start(t, 0)
	kp, err := f.ca.ClientCert("system:admin", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	edge, err := f.dial(kp.TLS, f.ca)
	if err != nil {
		t.Fatal(err) // the chain is valid: the handshake succeeds
	}
	if code, ok := edge.WaitClosed(5 * time.Second); !ok || code != tunnel.CloseNotAllowed {
		t.Fatalf("close code %v (closed by gateway: %v), want CloseNotAllowed", code, ok)
	}
	if f.reg.Len() != 0 {
		t.Fatal("a non-node certificate was registered")
	}
	if got := f.counter(resultNotANode); got != 1 {
		t.Fatalf("not_a_node counter %v, want 1", got)
	}
}

func TestRefusesCertificateFromAnotherCA(t *testing.T) {
	f := start(t, 0)
	other := testenv.MustCA(t, "someone else's CA")
	kp, err := other.NodeCert("edge-1")
	if err != nil {
		t.Fatal(err)
	}
	edge, err := f.dial(kp.TLS, f.ca)
	if err == nil {
		// The client may finish its side of the TLS 1.3 handshake before
		// the gateway has checked its certificate; then the gateway closes
		// the connection with a TLS alert.
		<-edge.Conn().Context().Done()
		err = context.Cause(edge.Conn().Context())
	}
	var te *quic.TransportError
	if !errors.As(err, &te) || !te.Remote {
		t.Fatalf("connection ended with %v, want the gateway's TLS alert", err)
	}
	if f.reg.Len() != 0 || f.counter(resultRegistered) != 0 {
		t.Fatal("a certificate from another CA was registered")
	}
	if got := f.counter(resultUnknownCA); got != 1 {
		t.Fatalf("unknown_ca counter %v, want 1", got)
	}
}

func TestShutdownDrainsStreams(t *testing.T) {
	f := start(t, 10*time.Second)
	edge := f.node("edge-1")
	s, err := f.reg.Open(context.Background(), "edge-1")
	if err != nil {
		t.Fatal(err)
	}

	f.cancel()
	select {
	case err := <-f.done:
		t.Fatalf("Serve returned (%v) while a stream was open", err)
	case <-time.After(100 * time.Millisecond):
	}
	if _, closed := edge.CloseCode(); closed {
		t.Fatal("tunnel closed while a stream was open")
	}
	// New edges are not accepted while draining.
	kp2, err := f.ca.NodeCert("edge-2")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if late, err := edgetest.Dial(ctx, f.srv.Addr().String(), edgetest.Options{
		Cert: kp2.TLS, Roots: f.ca.Pool(), ServerName: "gateway",
	}); err == nil {
		late.Close()
		t.Fatal("a new tunnel was accepted during shutdown")
	}

	s.Close()
	s.Release()
	if err := <-f.done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	f.done <- nil // for the cleanup
	if code, ok := edge.WaitClosed(5 * time.Second); !ok || code != tunnel.CloseShutdown {
		t.Fatalf("close code %v (closed by gateway: %v), want CloseShutdown", code, ok)
	}
}

func TestShutdownGraceExpires(t *testing.T) {
	f := start(t, 50*time.Millisecond)
	edge := f.node("edge-1")
	s, err := f.reg.Open(context.Background(), "edge-1")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release()
	f.cancel()
	if err := <-f.done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	f.done <- nil
	if code, ok := edge.WaitClosed(5 * time.Second); !ok || code != tunnel.CloseShutdown {
		t.Fatalf("close code %v (closed by gateway: %v), want CloseShutdown", code, ok)
	}
}
