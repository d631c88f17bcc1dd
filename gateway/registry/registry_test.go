package registry

import (
	"context"
	"crypto/tls"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/gateway/internal/edgetest"
	"github.com/tether-edge/tether/gateway/internal/metrictest"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// harness is a real QUIC listener on loopback whose accepted connections
// the test registers by hand.
type harness struct {
	t  *testing.T
	ca *testenv.CA
	ln *quic.Listener
}

// newHarness starts the listener. It is called first in each test, so
// the leak check it starts runs after all the test's cleanups: every
// connection and stream the test opened has ended, and with them their
// goroutines and sockets.
func newHarness(t *testing.T) *harness {
	t.Helper()
	testenv.CheckLeaks(t)
	ca := testenv.MustCA(t, "tether test CA")
	srv, err := ca.ServerCert("gateway", "gateway", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	tc := tunnel.ServerTLS(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &srv.TLS, nil }, ca.Pool())
	ln, err := quic.ListenAddr("127.0.0.1:0", tc, tunnel.QUICConfig(tunnel.Limits{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return &harness{t: t, ca: ca, ln: ln}
}

// connect dials the listener as an edge with the given client certificate
// and returns the test edge and the gateway's side of the connection.
func (h *harness) connect(cert *testenv.KeyPair, allow func(tunnel.Request) tunnel.Code) (*edgetest.Edge, *quic.Conn) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := edgetest.Dial(ctx, h.ln.Addr().String(), edgetest.Options{
		Cert: cert.TLS, Roots: h.ca.Pool(), ServerName: "gateway", Allow: allow,
	})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(e.Close)
	conn, err := h.ln.Accept(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { conn.CloseWithError(0, "") })
	return e, conn
}

func (h *harness) nodeCert(node string) *testenv.KeyPair {
	h.t.Helper()
	kp, err := h.ca.NodeCert(node)
	if err != nil {
		h.t.Fatal(err)
	}
	return kp
}

func TestRegisterReplacesSameNode(t *testing.T) {
	h := newHarness(t)
	r := New(Options{})
	edge1, conn1 := h.connect(h.nodeCert("edge-1"), nil)
	e1, err := r.Register(conn1)
	if err != nil {
		t.Fatal(err)
	}
	if e1.Node() != "edge-1" {
		t.Fatalf("registered as %q, want edge-1", e1.Node())
	}
	other, connOther := h.connect(h.nodeCert("edge-2"), nil)
	if _, err := r.Register(connOther); err != nil {
		t.Fatal(err)
	}

	// A second certificate for the same node (a rotated one) replaces the
	// first registration, which is closed with CloseReplaced.
	edge1b, conn1b := h.connect(h.nodeCert("edge-1"), edgetest.AllowPorts())
	e1b, err := r.Register(conn1b)
	if err != nil {
		t.Fatal(err)
	}
	if code, ok := edge1.WaitClosed(5 * time.Second); !ok || code != tunnel.CloseReplaced {
		t.Fatalf("old connection: close code %v (closed by gateway: %v), want CloseReplaced", code, ok)
	}
	if got, _ := r.Lookup("edge-1"); got != e1b {
		t.Fatal("Lookup(edge-1) is not the newest registration")
	}
	r.Unregister(e1) // the replaced edge's own cleanup must not remove the new one
	if got, _ := r.Lookup("edge-1"); got != e1b {
		t.Fatal("unregistering the replaced edge removed its successor")
	}
	if _, closed := other.CloseCode(); closed || r.Len() != 2 {
		t.Fatalf("edge-2 disturbed by edge-1's replacement (closed %v, %d edges)", closed, r.Len())
	}

	// Streams for edge-1 now reach the new connection.
	s, err := r.Open(context.Background(), "edge-1")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Release()
	if err := tunnel.WriteRequest(s, tunnel.Request{Dest: mustAddrPort("127.0.0.1:10250")}); err != nil {
		t.Fatal(err)
	}
	s.SetReadDeadline(time.Now().Add(5 * time.Second))
	var refused *tunnel.RefusedError
	if _, err := tunnel.ReadReply(s); !errors.As(err, &refused) || refused.Code != tunnel.NotAllowed {
		t.Fatalf("reply: %v, want the new edge's not_allowed refusal", err)
	}
	if n := len(edge1b.Requests()); n != 1 {
		t.Fatalf("new edge-1 connection saw %d requests, want 1", n)
	}

	r.Unregister(e1b)
	if _, ok := r.Lookup("edge-1"); ok {
		t.Fatal("edge-1 still registered after Unregister")
	}
	if _, err := r.Open(context.Background(), "edge-1"); !errors.Is(err, ErrNoTunnel) || Reason(err) != ReasonNoTunnel {
		t.Fatalf("Open after Unregister: %v, want ErrNoTunnel", err)
	}

	for _, m := range []struct {
		name  string
		label []string
		want  float64
	}{
		{"tether_gateway_edge_registrations_total", []string{"result=new"}, 2},
		{"tether_gateway_edge_registrations_total", []string{"result=replaced"}, 1},
		{"tether_gateway_edges_connected", nil, 1},
	} {
		if got, err := metrictest.Value(r, m.name, m.label...); err != nil || got != m.want {
			t.Errorf("%s%v = %v (%v), want %v", m.name, m.label, got, err, m.want)
		}
	}
}

// A registration replaced while it relays keeps its connection until its
// last stream ends: an edge that reconnected with a rotated certificate
// loses none of the connections it relays.
func TestReplacedRegistrationDrains(t *testing.T) {
	h := newHarness(t)
	r := New(Options{})
	edge1, conn1 := h.connect(h.nodeCert("edge-1"), nil)
	e1, err := r.Register(conn1)
	if err != nil {
		t.Fatal(err)
	}
	s1, err := r.Open(context.Background(), "edge-1")
	if err != nil {
		t.Fatal(err)
	}
	_, conn1b := h.connect(h.nodeCert("edge-1"), nil)
	e1b, err := r.Register(conn1b)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Lookup("edge-1"); got != e1b {
		t.Fatal("new streams do not go to the newest registration")
	}
	if code, closed := edge1.WaitClosed(300 * time.Millisecond); closed {
		t.Fatalf("replaced connection closed (%v) with a stream open on it", code)
	}
	// The open stream still works on the old connection.
	if _, err := s1.Write([]byte("still here")); err != nil {
		t.Fatalf("write on the old connection's stream: %v", err)
	}
	s1.Release() // the relay is done with it
	if code, ok := edge1.WaitClosed(5 * time.Second); !ok || code != tunnel.CloseReplaced {
		t.Fatalf("old connection after its last stream: close code %v (closed by gateway: %v), want CloseReplaced", code, ok)
	}
	r.Unregister(e1)
	if got, _ := r.Lookup("edge-1"); got != e1b {
		t.Fatal("the drained registration's cleanup removed its successor")
	}
}

func TestRegisterRefusesNonNodeCertificate(t *testing.T) {
	h := newHarness(t)
	r := New(Options{})
	kp, err := h.ca.ClientCert("admin", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	_, conn := h.connect(kp, nil)
	if _, err := r.Register(conn); !errors.Is(err, tunnel.ErrNotANode) {
		t.Fatalf("Register: %v, want ErrNotANode", err)
	}
	if r.Len() != 0 {
		t.Fatal("a non-node certificate was registered")
	}
}

func TestOpenStreamLimit(t *testing.T) {
	h := newHarness(t)
	r := New(Options{MaxStreams: 2, OpenWait: 50 * time.Millisecond})
	_, conn := h.connect(h.nodeCert("edge-1"), nil)
	e, err := r.Register(conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s1, err := r.Open(ctx, "edge-1")
	if err != nil {
		t.Fatal(err)
	}
	s2, err := r.Open(ctx, "edge-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Open(ctx, "edge-1"); !errors.Is(err, ErrOverloaded) || Reason(err) != ReasonOverloaded {
		t.Fatalf("third Open: %v, want ErrOverloaded", err)
	}
	if st := e.Status(); st.Streams != 2 || st.Refusals[ReasonOverloaded] != 1 {
		t.Fatalf("status %+v, want 2 streams and 1 overloaded refusal", st)
	}

	// A slot freed while Open waits is taken.
	r.onWait = func() {
		s1.Release()
		s1.Release() // a second release must not free a second slot
	}
	r.openWait = 5 * time.Second
	s3, err := r.Open(ctx, "edge-1")
	if err != nil {
		t.Fatalf("Open after release: %v", err)
	}
	r.onWait = nil
	r.openWait = 50 * time.Millisecond
	if _, err := r.Open(ctx, "edge-1"); !errors.Is(err, ErrOverloaded) {
		t.Fatalf("Open with both slots taken again: %v, want ErrOverloaded", err)
	}

	// Drain waits for the last stream.
	dctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := r.Drain(dctx); err == nil {
		t.Fatal("Drain returned with streams open")
	}
	s2.Release()
	s3.Release()
	if err := r.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if st := e.Status(); st.Streams != 0 {
		t.Fatalf("%d streams after releasing all", st.Streams)
	}
}

func TestOpenOnClosedConnection(t *testing.T) {
	h := newHarness(t)
	r := New(Options{})
	edge, conn := h.connect(h.nodeCert("edge-1"), nil)
	if _, err := r.Register(conn); err != nil {
		t.Fatal(err)
	}
	edge.Close()
	<-conn.Context().Done()
	_, err := r.Open(context.Background(), "edge-1")
	if !errors.Is(err, ErrNoTunnel) {
		t.Fatalf("Open on a closed connection: %v, want ErrNoTunnel", err)
	}
}

// Bytes of an edge that went away stay in the totals, including bytes its
// streams move after it was unregistered.
func TestTotalsSurviveReconnection(t *testing.T) {
	h := newHarness(t)
	r := New(Options{})
	_, conn := h.connect(h.nodeCert("edge-1"), nil)
	e, err := r.Register(conn)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.Open(context.Background(), "edge-1")
	if err != nil {
		t.Fatal(err)
	}
	opts := s.RelayOptions(0)
	opts.ToStream.Add(100)
	opts.FromStream.Add(1000)
	r.Unregister(e)
	opts.ToStream.Add(1) // the relay still runs
	if up, down := r.Totals(); up != 101 || down != 1000 {
		t.Fatalf("totals while draining: %d up, %d down", up, down)
	}
	s.Release()
	_, conn2 := h.connect(h.nodeCert("edge-1"), nil)
	e2, err := r.Register(conn2)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := r.Open(context.Background(), "edge-1")
	if err != nil {
		t.Fatal(err)
	}
	s2.RelayOptions(0).ToStream.Add(5)
	s2.Release()
	if up, down := r.Totals(); up != 106 || down != 1000 {
		t.Fatalf("totals after reconnection: %d up, %d down", up, down)
	}
	if st := e2.Status(); st.BytesUp != 5 {
		t.Fatalf("new registration counts %d bytes up, want 5", st.BytesUp)
	}
}

func mustAddrPort(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
