package tunnelserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/netip"
	"sync"
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
	testenv.Eventually(f.t, node+" is registered", func() bool { _, ok := f.reg.Lookup(node); return ok })
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

func TestAcceptsNodeCertificate(t *testing.T) {
	f := start(t, 0)
	edge := f.node("edge-1")
	if got := f.counter(resultRegistered); got != 1 {
		t.Fatalf("registered counter %v, want 1", got)
	}

	// Without a heartbeat or election handler, the edge's liveness
	// probes are answered, and its other requests refused.
	if rep, err := delegate(t, edge, tunnel.AppendProbeRequest(nil)); err != nil || rep.Code != tunnel.OK {
		t.Fatalf("probe answered %+v, %v; want OK", rep, err)
	}
	raw, err := tunnel.AppendDelegateRequest(nil, tunnel.DelegateRequest{Node: "edge-2", Lease: []byte("{}")})
	if err != nil {
		t.Fatal(err)
	}
	if rep, err := delegate(t, edge, raw); rep.Code != tunnel.BadRequest {
		t.Fatalf("delegate request answered %+v, %v; want BadRequest from a gateway without a handler", rep, err)
	}
	if got := f.edgeStreams(streamProbe); got != 1 {
		t.Fatalf("probe streams counted %v, want 1", got)
	}

	edge.Close()
	testenv.Eventually(t, "edge-1 is unregistered", func() bool { return f.reg.Len() == 0 })
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

// recordingHeartbeats answers every delegated heartbeat with reply and
// records what it was given.
type recordingHeartbeats struct {
	mu    sync.Mutex // guards reply, which a test may change while the server runs
	reply tunnel.Reply
	calls chan heartbeatCall
	block chan struct{} // if set, Delegate waits for it to close
}

type heartbeatCall struct {
	sender string
	req    tunnel.DelegateRequest
}

func (r *recordingHeartbeats) Delegate(ctx context.Context, sender string, req tunnel.DelegateRequest) tunnel.Reply {
	r.mu.Lock()
	reply := r.reply
	r.mu.Unlock()
	r.calls <- heartbeatCall{sender, req}
	if r.block != nil {
		select {
		case <-r.block:
		case <-ctx.Done():
		}
	}
	return reply
}

// delegate opens a stream on the edge's connection, writes raw and reads
// the gateway's reply.
func delegate(t *testing.T, edge *edgetest.Edge, raw []byte) (tunnel.Reply, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := edge.Conn().OpenStreamSync(ctx)
	if err != nil {
		t.Fatalf("open stream toward the gateway: %v", err)
	}
	if _, err := s.Write(raw); err != nil {
		t.Fatalf("write request: %v", err)
	}
	s.Close()
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	return tunnel.ReadReply(s)
}

func (f *fixture) edgeStreams(result string) float64 {
	f.t.Helper()
	v, err := metrictest.Value(f.srv.edgeStreams, "tether_gateway_tunnel_edge_streams_total", "result="+result)
	if err != nil {
		f.t.Fatal(err)
	}
	return v
}

// An edge's delegate-heartbeat stream reaches the handler with the node
// name of the edge's certificate, whatever the request says, and the
// handler's reply reaches the edge.
func TestDelegateHeartbeatStream(t *testing.T) {
	hb := &recordingHeartbeats{calls: make(chan heartbeatCall, 4), reply: tunnel.Reply{Code: tunnel.NotLeader, Message: "pool p is led by edge-9"}}
	f := startWith(t, func(o *Options) { o.Heartbeats = hb })
	edge := f.node("edge-1")

	lease := []byte(`{"metadata":{"name":"edge-2","namespace":"kube-node-lease"}}`)
	raw, err := tunnel.AppendDelegateRequest(nil, tunnel.DelegateRequest{Node: "edge-2", Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := delegate(t, edge, raw)
	var re *tunnel.RefusedError
	if !errors.As(err, &re) || rep != hb.reply {
		t.Fatalf("reply %+v, %v; want %+v", rep, err, hb.reply)
	}
	call := <-hb.calls
	if call.sender != "edge-1" || call.req.Node != "edge-2" || string(call.req.Lease) != string(lease) {
		t.Fatalf("handler got %+v", call)
	}

	hb.mu.Lock()
	hb.reply = tunnel.Reply{Code: tunnel.OK}
	hb.mu.Unlock()
	if rep, err := delegate(t, edge, raw); err != nil || rep.Code != tunnel.OK {
		t.Fatalf("reply %+v, %v; want OK", rep, err)
	}
	<-hb.calls
	if got := f.edgeStreams(streamServed); got != 2 {
		t.Errorf("served count %v, want 2", got)
	}
}

// A malformed request, or a connect request from the edge, is answered
// BadRequest and never reaches the handler.
func TestDelegateHeartbeatBadRequest(t *testing.T) {
	hb := &recordingHeartbeats{calls: make(chan heartbeatCall, 4)}
	f := startWith(t, func(o *Options) { o.Heartbeats = hb })
	edge := f.node("edge-1")
	connect, err := tunnel.AppendRequest(nil, tunnel.Request{Dest: netip.MustParseAddrPort("10.0.0.1:10250")})
	if err != nil {
		t.Fatal(err)
	}
	for name, raw := range map[string][]byte{
		"connect request": connect,
		"version 9":       {9, 2, 0, 3, 1, 'a', '{'},
		"bad node name":   {1, 2, 0, 4, 2, 'A', '_', '{'},
		"no lease":        {1, 2, 0, 2, 1, 'a'},
	} {
		t.Run(name, func(t *testing.T) {
			rep, err := delegate(t, edge, raw)
			if rep.Code != tunnel.BadRequest || err == nil {
				t.Fatalf("reply %+v, %v; want bad_request", rep, err)
			}
		})
	}
	// A request cut short by the edge's FIN ends the stream unanswered.
	for name, raw := range map[string][]byte{
		"short, then FIN":           {1, 2, 0, 40, 1, 'a'},
		"64K announced, 2 bytes in": {1, 2, 0xff, 0xff, 1, 'a'},
	} {
		t.Run(name, func(t *testing.T) {
			if rep, err := delegate(t, edge, raw); err == nil {
				t.Fatalf("reply %+v to a truncated request", rep)
			}
		})
	}
	select {
	case c := <-hb.calls:
		t.Fatalf("a bad request reached the handler: %+v", c)
	default:
	}
	if bad, aborted := f.edgeStreams(streamBadRequest), f.edgeStreams(streamAborted); bad != 4 || aborted != 2 {
		t.Errorf("bad_request count %v, aborted %v; want 4 and 2", bad, aborted)
	}
}

// A request that never comes is answered BadRequest after the header
// timeout.
func TestDelegateHeartbeatSilentStream(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the 5 s header timeout")
	}
	hb := &recordingHeartbeats{calls: make(chan heartbeatCall, 1)}
	f := startWith(t, func(o *Options) { o.Heartbeats = hb })
	edge := f.node("edge-1")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := edge.Conn().OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Write([]byte{1, 2, 0, 9}) // and nothing more
	s.SetReadDeadline(time.Now().Add(edgeRequestTimeout + 5*time.Second))
	if rep, err := tunnel.ReadReply(s); rep.Code != tunnel.BadRequest || err == nil {
		t.Fatalf("reply %+v, %v; want bad_request", rep, err)
	}
}

// An edge may have tunnel.MaxStreamsToGateway streams open toward the
// gateway at once; the next waits for one of them to end.
func TestDelegateHeartbeatStreamLimit(t *testing.T) {
	hb := &recordingHeartbeats{calls: make(chan heartbeatCall, 64), block: make(chan struct{}), reply: tunnel.Reply{Code: tunnel.OK}}
	f := startWith(t, func(o *Options) { o.Heartbeats = hb })
	edge := f.node("edge-1")
	raw, _ := tunnel.AppendDelegateRequest(nil, tunnel.DelegateRequest{Node: "edge-2", Lease: []byte("{}")})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var open []*quic.Stream
	for range tunnel.MaxStreamsToGateway {
		s, err := edge.Conn().OpenStreamSync(ctx)
		if err != nil {
			t.Fatalf("stream %d: %v", len(open)+1, err)
		}
		s.Write(raw)
		s.Close()
		open = append(open, s)
	}
	for range tunnel.MaxStreamsToGateway {
		<-hb.calls
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if _, err := edge.Conn().OpenStreamSync(short); err == nil {
		t.Fatalf("stream %d opened while %d were busy", tunnel.MaxStreamsToGateway+1, tunnel.MaxStreamsToGateway)
	}
	close(hb.block)
	for _, s := range open {
		s.SetReadDeadline(time.Now().Add(5 * time.Second))
		if rep, err := tunnel.ReadReply(s); err != nil || rep.Code != tunnel.OK {
			t.Fatalf("reply %+v, %v", rep, err)
		}
		s.CancelRead(0)
	}
	// With the streams done, the edge may open more.
	if rep, err := delegate(t, edge, raw); err != nil || rep.Code != tunnel.OK {
		t.Fatalf("after the busy streams: %+v, %v", rep, err)
	}
}

// With a receive budget (--max-receive-memory), the server exports its
// limit, what the tunnels hold of it, and the refusals.
func TestReceiveBudgetMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	startWith(t, func(o *Options) {
		o.Registerer = reg
		o.Limits.ReceiveBudget = tunnel.NewReceiveBudget(64 << 20)
	})
	want := map[string]float64{
		"tether_gateway_tunnel_receive_window_growth_limit_bytes": 64 << 20,
		"tether_gateway_tunnel_receive_window_growth_bytes":       0,
		"tether_gateway_tunnel_receive_window_refusals_total":     0,
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		v, ok := want[mf.GetName()]
		if !ok {
			continue
		}
		m := mf.GetMetric()[0]
		got := m.GetGauge().GetValue() + m.GetCounter().GetValue()
		if got != v {
			t.Errorf("%s = %g, want %g", mf.GetName(), got, v)
		}
		delete(want, mf.GetName())
	}
	for name := range want {
		t.Errorf("%s not exported", name)
	}
}

// TestReplacedTooOftenRefused: a node's key that reconnects in a loop
// replaces its registration registry.DefaultReplaceBurst times; the next
// connection is closed with CloseReplaced and counted too_often, and the
// current one stays registered and open.
func TestReplacedTooOftenRefused(t *testing.T) {
	f := start(t, 0)
	kp, err := f.ca.NodeCert("edge-1")
	if err != nil {
		t.Fatal(err)
	}
	var current *edgetest.Edge
	for i := range registry.DefaultReplaceBurst + 1 {
		edge, err := f.dial(kp.TLS, f.ca)
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, fmt.Sprintf("connection %d registered", i+1), func() bool {
			return f.counter(resultRegistered) == float64(i+1)
		})
		current = edge
	}
	edge, err := f.dial(kp.TLS, f.ca)
	if err != nil {
		t.Fatal(err)
	}
	if code, ok := edge.WaitClosed(5 * time.Second); !ok || code != tunnel.CloseReplaced {
		t.Fatalf("close code %v (closed by gateway: %v), want CloseReplaced", code, ok)
	}
	if got := f.counter(resultTooOften); got != 1 {
		t.Errorf("too_often counter %v, want 1", got)
	}
	if _, closed := current.CloseCode(); closed {
		t.Error("the current registration was closed")
	}
	if _, ok := f.reg.Lookup("edge-1"); !ok || f.counter(resultRegistered) != float64(registry.DefaultReplaceBurst+1) {
		t.Errorf("edge-1 registered %v (want its current registration kept), %v registrations", ok, f.counter(resultRegistered))
	}
}
