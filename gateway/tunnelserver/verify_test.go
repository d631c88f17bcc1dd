package tunnelserver

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/gateway/internal/metrictest"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// logBuffer is a slog text destination safe for concurrent writes.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// refusedHandshake dials with cert and returns the error the handshake
// ended with, which must be the gateway's TLS alert.
func (f *fixture) refusedHandshake(cert tls.Certificate) error {
	f.t.Helper()
	edge, err := f.dial(cert, f.ca)
	if err == nil {
		// TLS 1.3: the client may finish its side first; the gateway's
		// alert then closes the connection.
		<-edge.Conn().Context().Done()
		err = context.Cause(edge.Conn().Context())
	}
	var te *quic.TransportError
	if !errors.As(err, &te) || !te.Remote || !te.ErrorCode.IsCryptoError() {
		f.t.Fatalf("connection ended with %v, want the gateway's TLS alert", err)
	}
	return err
}

// streamWorks opens a stream to node through the registry: the tunnel is
// up and usable.
func (f *fixture) streamWorks(node string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := f.reg.Open(ctx, node)
	if err != nil {
		f.t.Fatalf("open a stream to %s: %v", node, err)
	}
	s.Close()
	s.Release()
}

// Each bad certificate is refused during the handshake, with its reason
// logged (with the peer's address) and counted, and an edge already
// connected is not disturbed.
func TestHandshakeRefusals(t *testing.T) {
	logs := &logBuffer{}
	f := startWith(t, func(o *Options) { o.Logger = logs.logger() })
	honest := f.node("edge-1")

	node := func(tmpl testenv.Template) tls.Certificate {
		tmpl.CommonName, tmpl.Organizations = "system:node:edge-2", []string{"system:nodes"}
		if tmpl.ExtKeyUsage == nil {
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		}
		kp, err := f.ca.Issue(tmpl)
		if err != nil {
			t.Fatal(err)
		}
		return kp.TLS
	}
	now := time.Now()
	otherCA := testenv.MustCA(t, "someone else's CA")
	foreign, err := otherCA.NodeCert("edge-2")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, reason string
		cert         tls.Certificate
	}{
		{"expired", resultExpired, node(testenv.Template{NotBefore: now.Add(-48 * time.Hour), NotAfter: now.Add(-time.Hour)})},
		{"not yet valid", resultExpired, node(testenv.Template{NotBefore: now.Add(time.Hour), NotAfter: now.Add(48 * time.Hour)})},
		{"from another CA", resultUnknownCA, foreign.TLS},
		{"none", resultNoCertificate, tls.Certificate{}},
		{"a server certificate", resultBadCertificate, node(testenv.Template{ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := f.counter(tc.reason)
			f.refusedHandshake(tc.cert)
			if got := f.counter(tc.reason); got != before+1 {
				t.Errorf("%s counter %v, want %v", tc.reason, got, before+1)
			}
			if !strings.Contains(logs.String(), "reason="+tc.reason) || !strings.Contains(logs.String(), "remote=127.0.0.1:") {
				t.Errorf("no refusal logged with reason %s and the peer's address:\n%s", tc.reason, logs.String())
			}
			if _, ok := f.reg.Lookup("edge-2"); ok {
				t.Fatal("edge-2 registered")
			}
			if _, closed := honest.CloseCode(); closed {
				t.Fatal("the honest edge's tunnel was closed")
			}
			f.streamWorks("edge-1")
		})
	}
	if got := f.counter(resultRegistered); got != 1 {
		t.Errorf("registered counter %v, want 1 (the honest edge)", got)
	}
}

// The client CAs are asked for on every handshake: a CA added is trusted
// by the next handshake, one removed no longer, and the tunnels up are not
// dropped by the change itself.
func TestClientCARotation(t *testing.T) {
	var pool atomic.Pointer[x509.CertPool]
	f := startWith(t, func(o *Options) {
		o.ClientCAs = nil
		o.GetClientCAs = pool.Load
		o.RecheckInterval = time.Hour // not in this test
	})
	caOld, caNew := f.ca, testenv.MustCA(t, "the new cluster CA")
	pool.Store(caOld.Pool())
	edge1 := f.node("edge-1")

	kp2, err := caNew.NodeCert("edge-2")
	if err != nil {
		t.Fatal(err)
	}
	f.refusedHandshake(kp2.TLS)

	both := caOld.Pool()
	both.AddCert(caNew.Cert)
	pool.Store(both)
	if _, err := f.dial(kp2.TLS, f.ca); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "edge-2 registered with the new CA", func() bool { _, ok := f.reg.Lookup("edge-2"); return ok })

	pool.Store(caNew.Pool())
	kp3, err := caOld.NodeCert("edge-3")
	if err != nil {
		t.Fatal(err)
	}
	f.refusedHandshake(kp3.TLS)
	if _, closed := edge1.CloseCode(); closed {
		t.Fatal("a CA change closed a tunnel by itself")
	}
	f.streamWorks("edge-1")
	f.streamWorks("edge-2")
}

// Live tunnels are verified again: one whose certificate expired, or whose
// CA was removed, is closed with CloseNotAllowed and counted; the others
// stay.
func TestRecheckEvicts(t *testing.T) {
	var pool atomic.Pointer[x509.CertPool]
	var clock atomic.Pointer[time.Time]
	start := time.Now()
	clock.Store(&start)
	logs := &logBuffer{}
	f := startWith(t, func(o *Options) {
		o.ClientCAs = nil
		o.GetClientCAs = pool.Load
		o.Now = func() time.Time { return *clock.Load() }
		o.RecheckInterval = 20 * time.Millisecond
		o.Logger = logs.logger()
	})
	caB := testenv.MustCA(t, "CA B")
	both := f.ca.Pool()
	both.AddCert(caB.Cert)
	pool.Store(both)

	shortLived, err := f.ca.Issue(testenv.Template{
		CommonName: "system:node:edge-short", Organizations: []string{"system:nodes"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, NotAfter: start.Add(time.Hour),
	})
	if err != nil {
		t.Fatal(err)
	}
	short, err := f.dial(shortLived.TLS, f.ca)
	if err != nil {
		t.Fatal(err)
	}
	fromB, err := caB.NodeCert("edge-b")
	if err != nil {
		t.Fatal(err)
	}
	b, err := f.dial(fromB.TLS, f.ca)
	if err != nil {
		t.Fatal(err)
	}
	honest := f.node("edge-1")
	testenv.Eventually(t, "three edges", func() bool { return f.reg.Len() == 3 })

	evictions := func(reason string) float64 {
		v, err := metrictest.Value(f.srv.evictions, "tether_gateway_tunnel_evictions_total", "reason="+reason)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	later := start.Add(2 * time.Hour)
	clock.Store(&later)
	if code, ok := short.WaitClosed(5 * time.Second); !ok || code != tunnel.CloseNotAllowed {
		t.Fatalf("expired tunnel closed with %v (by gateway: %v), want CloseNotAllowed", code, ok)
	}
	pool.Store(f.ca.Pool())
	if code, ok := b.WaitClosed(5 * time.Second); !ok || code != tunnel.CloseNotAllowed {
		t.Fatalf("tunnel of a removed CA closed with %v (by gateway: %v), want CloseNotAllowed", code, ok)
	}
	if evictions(resultExpired) != 1 || evictions(resultUnknownCA) != 1 {
		t.Errorf("evictions: expired %v, unknown_ca %v; want 1 each", evictions(resultExpired), evictions(resultUnknownCA))
	}
	if !strings.Contains(logs.String(), "tunnel closed: its client certificate no longer verifies") {
		t.Errorf("evictions not logged:\n%s", logs.String())
	}
	if _, closed := honest.CloseCode(); closed {
		t.Fatal("the honest edge's tunnel was closed")
	}
	f.streamWorks("edge-1")
}

// A limit lets burst lines through per window (refusalLogBurst when 0;
// the busy refusals' has 1), holds back the rest and reports them with
// the next window's first line.
func TestLogLimit(t *testing.T) {
	for _, tc := range []struct{ burst, want, over int }{{0, refusalLogBurst, 5}, {1, 1, 3}} {
		l := logLimit{burst: tc.burst}
		now := time.Now()
		for i := range tc.want {
			if ok, _ := l.allow(now); !ok {
				t.Fatalf("burst %d: line %d held back", tc.burst, i)
			}
		}
		for range tc.over {
			if ok, _ := l.allow(now.Add(time.Second)); ok {
				t.Fatalf("burst %d: a line over the burst let through", tc.burst)
			}
		}
		ok, dropped := l.allow(now.Add(refusalLogWindow))
		if !ok || dropped != tc.over {
			t.Fatalf("burst %d: next window: ok %v, dropped %d; want true, %d", tc.burst, ok, dropped, tc.over)
		}
	}
}

// A chain is verified again only when the client CAs changed or a
// NotAfter along it passed; what a recheck does not keep is forgotten.
func TestVerifiedLeaves(t *testing.T) {
	var v verifiedLeaves
	leaf, other := &x509.Certificate{}, &x509.Certificate{}
	poolA, poolB := x509.NewCertPool(), x509.NewCertPool()
	now := time.Now()
	v.note(leaf, poolA, now.Add(time.Hour))
	for _, c := range []struct {
		leaf *x509.Certificate
		pool *x509.CertPool
		at   time.Time
		want bool
	}{
		{leaf, poolA, now, true},
		{leaf, poolA, now.Add(time.Hour), false}, // its chain's first NotAfter
		{leaf, poolB, now, false},                // other client CAs
		{other, poolA, now, false},               // never verified
	} {
		if got := v.stillGood(c.leaf, c.pool, c.at); got != c.want {
			t.Errorf("stillGood(leaf %v, same pool %v, +%v) = %v, want %v", c.leaf == leaf, c.pool == poolA, c.at.Sub(now), got, c.want)
		}
	}
	v.note(other, poolA, now.Add(time.Hour))
	v.keep(map[*x509.Certificate]bool{other: true})
	if v.stillGood(leaf, poolA, now) || !v.stillGood(other, poolA, now) {
		t.Error("keep did not forget exactly the leaves it was not given")
	}
}

// verifyChain's until is the first NotAfter along the chain: a CA that
// expires before its leaf ends the chain's life.
func TestVerifyChainUntil(t *testing.T) {
	ca := testenv.MustCA(t, "CA")
	for _, c := range []struct {
		name     string
		notAfter time.Time
	}{
		{"leaf ends first", time.Now().Add(time.Hour)},
		{"CA ends first", ca.Cert.NotAfter.Add(24 * time.Hour)},
	} {
		leaf, err := ca.Issue(testenv.Template{
			CommonName: "system:node:edge-1", Organizations: []string{"system:nodes"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, NotAfter: c.notAfter,
		})
		if err != nil {
			t.Fatal(err)
		}
		until, err := verifyChain([]*x509.Certificate{leaf.Cert}, ca.Pool(), time.Now())
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		want := leaf.Cert.NotAfter
		if ca.Cert.NotAfter.Before(want) {
			want = ca.Cert.NotAfter
		}
		if !until.Equal(want) {
			t.Errorf("%s: until %v, want %v (leaf %v, CA %v)", c.name, until, want, leaf.Cert.NotAfter, ca.Cert.NotAfter)
		}
	}
	if ca.Cert.NotAfter.Before(time.Now().Add(time.Hour)) {
		t.Fatal("the test CA ends within the hour: the leaf-first case tests nothing")
	}
}

// What the recheck remembers is bounded by the live tunnels: a handshake
// adds nothing (a client refused after it, or reconnecting in a loop,
// pins no certificate), a recheck adds the live tunnels' leaves, and the
// next one forgets a closed tunnel's.
func TestVerifiedLeavesHoldOnlyLiveTunnels(t *testing.T) {
	f := start(t, time.Second)
	remembered := func() int {
		f.srv.verified.mu.Lock()
		defer f.srv.verified.mu.Unlock()
		return len(f.srv.verified.m)
	}
	notANode, err := f.ca.ClientCert("someone")
	if err != nil {
		t.Fatal(err)
	}
	refused, err := f.dial(notANode.TLS, f.ca)
	if err != nil {
		t.Fatal(err)
	}
	if code, ok := refused.WaitClosed(10 * time.Second); !ok || code != tunnel.CloseNotAllowed {
		t.Fatalf("a client certificate that names no node: closed with %v (by gateway: %v), want CloseNotAllowed", code, ok)
	}
	f.node("edge-1")
	gone := f.node("edge-2")
	if n := remembered(); n != 0 {
		t.Fatalf("%d leaves remembered after handshakes alone, want 0", n)
	}
	f.srv.recheckLive()
	if n := remembered(); n != 2 {
		t.Fatalf("%d leaves remembered after a recheck of 2 live tunnels, want 2", n)
	}
	gone.Close()
	testenv.Eventually(t, "edge-2's tunnel is no longer live", func() bool {
		f.srv.mu.Lock()
		defer f.srv.mu.Unlock()
		return len(f.srv.live) == 1
	})
	f.srv.recheckLive()
	if n := remembered(); n != 1 {
		t.Fatalf("%d leaves remembered after a recheck of 1 live tunnel, want 1", n)
	}
}
