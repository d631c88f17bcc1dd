package tunnelserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/gateway/internal/metrictest"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// stalledEdge dials the gateway and stops in the middle of its handshake:
// when the gateway's flight has come (the gateway let the handshake in),
// it says so on asked and waits for go before it sends its certificate.
type stalledEdge struct {
	name  string
	asked chan string
	proc  chan error // nil: send the certificate; else abort with it
	done  chan error // the dial's result
}

func (f *fixture) stalledEdge(name string, asked chan string) *stalledEdge {
	f.t.Helper()
	kp, err := f.ca.NodeCert(name)
	if err != nil {
		f.t.Fatal(err)
	}
	e := &stalledEdge{name: name, asked: asked, proc: make(chan error, 1), done: make(chan error, 1)}
	tc := tunnel.ClientTLS(func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		e.asked <- e.name
		if err := <-e.proc; err != nil {
			return nil, err
		}
		return &kp.TLS, nil
	}, f.ca.Pool(), "gateway")
	// The gateway keeps it waiting for longer than the edges' 5 s
	// handshake timeout on a slow machine.
	qc := tunnel.QUICConfig(tunnel.Limits{})
	qc.HandshakeIdleTimeout = time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	go func() {
		defer cancel()
		conn, err := quic.DialAddr(ctx, f.srv.Addr().String(), tc, qc)
		if err == nil {
			f.t.Cleanup(func() { conn.CloseWithError(0, "") })
		}
		e.done <- err
	}()
	return e
}

// result waits for the dial's result.
func (e *stalledEdge) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-e.done:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("%s: dial did not end", e.name)
		return nil
	}
}

func nextAsked(t *testing.T, asked <-chan string) string {
	t.Helper()
	select {
	case n := <-asked:
		return n
	case <-time.After(time.Minute):
		t.Fatal("no handshake was let in")
		return ""
	}
}

// waitGate polls the server's gate until it holds in and has waiting.
func (f *fixture) waitGate(in, waiting int) {
	f.t.Helper()
	waitCounts(f.t, f.srv.gate, in, waiting)
}

// --max-handshakes: beyond the bound handshakes wait, and a place that
// frees goes to the newest of them.
func TestHandshakesWaitNewestFirst(t *testing.T) {
	f := startWith(t, func(o *Options) { o.MaxHandshakes = 1; o.handshakeWait = time.Minute })
	asked := make(chan string, 3)
	a := f.stalledEdge("edge-a", asked)
	if got := nextAsked(t, asked); got != "edge-a" {
		t.Fatalf("first in: %s", got)
	}
	f.waitGate(1, 0)
	b := f.stalledEdge("edge-b", asked)
	f.waitGate(1, 1)
	c := f.stalledEdge("edge-c", asked)
	f.waitGate(1, 2)

	a.proc <- nil // edge-a's certificate: its place frees
	if err := a.result(t); err != nil {
		t.Fatalf("edge-a: %v", err)
	}
	if got := nextAsked(t, asked); got != "edge-c" {
		t.Fatalf("let in after edge-a: %s, want edge-c, the newest waiter", got)
	}
	f.waitGate(1, 1)
	c.proc <- nil
	if got := nextAsked(t, asked); got != "edge-b" {
		t.Fatalf("let in after edge-c: %s", got)
	}
	b.proc <- nil
	for _, e := range []*stalledEdge{b, c} {
		if err := e.result(t); err != nil {
			t.Fatalf("%s: %v", e.name, err)
		}
	}
	for _, n := range []string{"edge-a", "edge-b", "edge-c"} {
		testenv.Eventually(t, n+" is registered", func() bool { _, ok := f.reg.Lookup(n); return ok })
	}
	f.waitGate(0, 0)
}

// A handshake that found no place in time is refused and counted; the
// edge gets in when it dials again.
func TestHandshakeShedAfterWait(t *testing.T) {
	f := startWith(t, func(o *Options) { o.MaxHandshakes = 1; o.handshakeWait = 100 * time.Millisecond })
	asked := make(chan string, 3)
	a := f.stalledEdge("edge-a", asked)
	nextAsked(t, asked)
	b := f.stalledEdge("edge-b", asked)
	err := b.result(t)
	// TLS internal_error as a QUIC CRYPTO_ERROR: what edges take for a
	// busy gateway (edgetunnel's alertInternalError) and wait longer after.
	var te *quic.TransportError
	if !errors.As(err, &te) || !te.Remote || te.ErrorCode != 0x100+80 {
		t.Fatalf("edge-b: %v, want the gateway's refusal with CRYPTO_ERROR 0x150", err)
	}
	t.Logf("edge-b refused: %v", err)
	if v, err := metrictest.Value(f.srv.shed, "tether_gateway_tunnel_handshakes_shed_total"); err != nil || v != 1 {
		t.Fatalf("shed counter %v (%v), want 1", v, err)
	}
	f.waitGate(1, 0)
	a.proc <- nil
	if err := a.result(t); err != nil {
		t.Fatalf("edge-a: %v", err)
	}
	f.waitGate(0, 0)
	f.node("edge-b")
}

// oneWaiting starts a gateway with one handshake place, held by edge-a in
// the middle of its handshake, and edge-b waiting for it.
func oneWaiting(t *testing.T) (f *fixture, asked chan string, a, b *stalledEdge) {
	t.Helper()
	f = startWith(t, func(o *Options) { o.MaxHandshakes = 1; o.handshakeWait = time.Minute })
	asked = make(chan string, 3)
	a = f.stalledEdge("edge-a", asked)
	nextAsked(t, asked)
	b = f.stalledEdge("edge-b", asked)
	f.waitGate(1, 1)
	return f, asked, a, b
}

// A handshake whose client gives up in the middle gives its place back.
func TestHandshakePlaceFreedByAbort(t *testing.T) {
	f, asked, a, b := oneWaiting(t)
	a.proc <- errors.New("edge gives up")
	if err := a.result(t); err == nil {
		t.Fatal("edge-a connected without its certificate")
	}
	if got := nextAsked(t, asked); got != "edge-b" {
		t.Fatalf("let in: %s", got)
	}
	b.proc <- nil
	if err := b.result(t); err != nil {
		t.Fatalf("edge-b: %v", err)
	}
	f.waitGate(0, 0)
}

// Shutting down refuses the handshakes waiting for a place.
func TestHandshakeWaitersRefusedAtShutdown(t *testing.T) {
	f, _, a, b := oneWaiting(t)
	f.cancel()
	if err := b.result(t); err == nil {
		t.Fatal("edge-b connected to a gateway shutting down")
	}
	a.proc <- nil
	a.result(t) // either way: the listener closed as its handshake ended
}

// deafConn sends what its client writes and reads nothing back: a client
// behind a forged source address, which never sees the gateway's answers.
type deafConn struct{ c *net.UDPConn }

func (d deafConn) ReadFrom(b []byte) (int, net.Addr, error) {
	for {
		if _, _, err := d.c.ReadFrom(b); err != nil {
			return 0, nil, err
		}
	}
}
func (d deafConn) WriteTo(b []byte, a net.Addr) (int, error) { return d.c.WriteTo(b, a) }
func (d deafConn) Close() error                              { return d.c.Close() }
func (d deafConn) LocalAddr() net.Addr                       { return d.c.LocalAddr() }
func (d deafConn) SetDeadline(t time.Time) error             { return d.c.SetDeadline(t) }
func (d deafConn) SetReadDeadline(t time.Time) error         { return d.c.SetReadDeadline(t) }
func (d deafConn) SetWriteDeadline(t time.Time) error        { return d.c.SetWriteDeadline(t) }
func (d deafConn) SetReadBuffer(n int) error                 { return d.c.SetReadBuffer(n) }
func (d deafConn) SetWriteBuffer(n int) error                { return d.c.SetWriteBuffer(n) }

// While half the places are held and handshakes were abandoned in
// numbers lately, a new client must answer a Retry from its address
// before its handshake takes a place: one that cannot (a forged source
// address) takes none, and an edge gets in one round trip later. Crowded
// without abandoned handshakes (a cold start), or after a flood but with
// places free, no Retry is sent.
func TestRetryWhenCrowdedAndFlooded(t *testing.T) {
	f := startWith(t, func(o *Options) {
		o.MaxHandshakes = 2
		o.handshakeWait = time.Minute
		o.floodThreshold = 1
	})
	metric := func(c prometheus.Counter, name string) float64 {
		t.Helper()
		v, err := metrictest.Value(c, name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	retries := func() float64 { return metric(f.srv.retries, "tether_gateway_tunnel_retries_total") }
	asked := make(chan string, 1)
	a := f.stalledEdge("edge-a", asked)
	nextAsked(t, asked)
	f.waitGate(1, 0) // half the places held

	// Crowded, but nothing abandoned: edges get in without a Retry.
	f.node("edge-b")
	if n := retries(); n != 0 {
		t.Fatalf("%v Retries with nothing abandoned", n)
	}

	// Edges that give up holding a place: abandoned. Fewer than
	// floodRatio against edge-b answered are no flood; floodRatio are, at
	// this threshold.
	for i := range floodRatio {
		name := fmt.Sprintf("edge-x%d", i)
		x := f.stalledEdge(name, asked)
		nextAsked(t, asked)
		x.proc <- errors.New("edge gives up")
		if err := x.result(t); err == nil {
			t.Fatalf("%s connected without its certificate", name)
		}
		f.waitGate(1, 0)
		if n := metric(f.srv.abandoned, "tether_gateway_tunnel_handshakes_abandoned_total"); n != float64(i+1) {
			t.Fatalf("abandoned handshakes: %v, want %d", n, i+1)
		}
		if got, want := f.srv.flood.flooded(time.Now()), i == floodRatio-1; got != want {
			t.Fatalf("%d abandoned against 1 answered: flood %v, want %v", i+1, got, want)
		}
	}

	// The forged client: its ClientHello is answered with a Retry it
	// never reads, and it resends its Initial until it gives up.
	uc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: deafConn{uc}}
	defer tr.Close()
	kp, err := f.ca.NodeCert("edge-forged")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	forged := make(chan error, 1)
	go func() {
		_, err := tr.Dial(ctx, f.srv.Addr(), tunnel.ClientTLS(func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return &kp.TLS, nil
		}, f.ca.Pool(), "gateway"), tunnel.QUICConfig(tunnel.Limits{}))
		forged <- err
	}()
	testenv.Eventually(t, "the forged client is sent a Retry or takes a place", func() bool {
		in, _ := f.srv.gate.counts()
		return retries() >= 1 || in > 1
	})
	if in, waiting := f.srv.gate.counts(); in != 1 || waiting != 0 {
		t.Fatalf("gate holds %d and has %d waiting after the forged client's Initial, want 1 and 0", in, waiting)
	}

	// An edge answers its Retry and takes the free place.
	before := retries()
	f.node("edge-c")
	if n := retries(); n <= before {
		t.Fatalf("edge-c got in without a Retry (%v before, %v after)", before, n)
	}
	cancel()
	if err := <-forged; err == nil {
		t.Fatal("the forged client's handshake succeeded")
	}
	if _, ok := f.reg.Lookup("edge-forged"); ok {
		t.Fatal("the forged client is registered")
	}

	// Below half the places, no Retry, flood or not.
	a.proc <- nil
	if err := a.result(t); err != nil {
		t.Fatalf("edge-a: %v", err)
	}
	f.waitGate(0, 0)
	before = retries()
	f.node("edge-d")
	if n := retries(); n != before {
		t.Fatalf("edge-d was sent %v Retries with the gate empty", n-before)
	}
	if n := metric(f.srv.abandoned, "tether_gateway_tunnel_handshakes_abandoned_total"); n != floodRatio {
		t.Fatalf("abandoned handshakes at the end: %v, want %d (the edges that gave up)", n, floodRatio)
	}
}
