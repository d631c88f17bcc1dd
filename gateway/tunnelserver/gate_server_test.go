package tunnelserver

import (
	"context"
	"crypto/tls"
	"errors"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/gateway/internal/metrictest"
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
		eventually(t, n+" is registered", func() bool { _, ok := f.reg.Lookup(n); return ok })
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
