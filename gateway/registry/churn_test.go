package registry

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	testclock "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/gateway/internal/metrictest"
	"github.com/tether-edge/tether/internal/testenv"
)

// fakeConn is a connection whose TLS handshake verified cert, from
// remote; it records how it was closed.
type fakeConn struct {
	cert   *x509.Certificate
	remote net.Addr
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	code   quic.ApplicationErrorCode
}

func newFakeConn(cert *x509.Certificate, port int) *fakeConn {
	ctx, cancel := context.WithCancel(context.Background())
	return &fakeConn{cert: cert, remote: &net.UDPAddr{IP: net.IPv4(100, 64, 0, 9), Port: port}, ctx: ctx, cancel: cancel}
}

func (c *fakeConn) ConnectionState() quic.ConnectionState {
	return quic.ConnectionState{TLS: tls.ConnectionState{PeerCertificates: []*x509.Certificate{c.cert}}}
}
func (c *fakeConn) ConnectionStats() quic.ConnectionStats { return quic.ConnectionStats{} }
func (c *fakeConn) OpenStreamSync(context.Context) (*quic.Stream, error) {
	return nil, errors.New("fake connection")
}
func (c *fakeConn) CloseWithError(code quic.ApplicationErrorCode, _ string) error {
	c.mu.Lock()
	c.closed, c.code = true, code
	c.mu.Unlock()
	c.cancel()
	return nil
}
func (c *fakeConn) Context() context.Context { return c.ctx }
func (c *fakeConn) RemoteAddr() net.Addr     { return c.remote }

func (c *fakeConn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// TestReplacementsBounded: a node's key that reconnects in a loop replaces
// its registration ReplaceBurst times, then is refused (the current
// registration kept) until the bucket refills; each node has its own
// bucket; replacements and refusals are counted, and logged at most one
// line per node per ReplaceLogEvery, with the count left out.
func TestReplacementsBounded(t *testing.T) {
	ca := testenv.MustCA(t, "tether test CA")
	cert := func(node string) *x509.Certificate {
		kp, err := ca.NodeCert(node)
		if err != nil {
			t.Fatal(err)
		}
		return kp.Cert
	}
	thief, other := cert("edge-1"), cert("edge-2")
	clk := testclock.NewFakePassiveClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	logs := &testenv.LogBuffer{}
	r := New(Options{ReplaceBurst: 3, ReplaceEvery: 10 * time.Second, Clock: clk, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	count := func(result string) float64 {
		t.Helper()
		v, err := metrictest.Value(r, "tether_gateway_edge_registrations_total", "result="+result)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	port := 1000
	register := func(c *x509.Certificate) (*fakeConn, error) {
		port++
		conn := newFakeConn(c, port)
		_, err := r.Register(conn)
		return conn, err
	}

	first, err := register(thief)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := register(other); err != nil {
		t.Fatal(err)
	}
	current := first
	for i := range 3 {
		conn, err := register(thief)
		if err != nil {
			t.Fatalf("replacement %d: %v", i+1, err)
		}
		if !current.isClosed() {
			t.Fatalf("replacement %d: the registration it replaced is still open", i+1)
		}
		current = conn
	}
	for i := range 50 {
		conn, err := register(thief)
		if !errors.Is(err, ErrReplacedTooOften) {
			t.Fatalf("replacement %d beyond the burst: %v, want ErrReplacedTooOften", i+1, err)
		}
		if current.isClosed() || conn.isClosed() {
			t.Fatal("a refused registration closed the current one, or the registry closed the refused one (the caller does)")
		}
	}
	if e, ok := r.Lookup("edge-1"); !ok || e.conn != current {
		t.Fatal("the current registration is not the last one accepted")
	}
	// Another node's replacements have their own budget.
	if _, err := register(other); err != nil {
		t.Fatalf("edge-2's replacement: %v", err)
	}
	if got, want := [3]float64{count("new"), count("replaced"), count("refused")}, [3]float64{2, 4, 50}; got != want {
		t.Errorf("registrations new, replaced, refused = %v, want %v", got, want)
	}
	lines := func(msg string) int { return strings.Count(logs.String(), msg) }
	if n, m := lines("edge registration replaced"), lines("edge registration refused"); n != 2 || m != 0 {
		t.Errorf("logged %d replacement lines (want one per node) and %d refusal lines (want 0 within the minute):\n%s", n, m, logs)
	}

	// A token is back after ReplaceEvery; a line after ReplaceLogEvery,
	// with the count of those left out: 2 replacements and 50 refusals
	// before, 1 and 1 after the refill.
	clk.SetTime(clk.Now().Add(10 * time.Second))
	if _, err := register(thief); err != nil {
		t.Fatalf("after %v: %v", 10*time.Second, err)
	}
	if _, err := register(thief); !errors.Is(err, ErrReplacedTooOften) {
		t.Fatalf("second after %v: %v, want ErrReplacedTooOften", 10*time.Second, err)
	}
	clk.SetTime(clk.Now().Add(ReplaceLogEvery))
	if _, err := register(thief); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("suppressed=%d", 2+50+1+1)
	if n := lines("edge registration replaced"); n != 3 || !strings.Contains(logs.String(), want) {
		t.Errorf("after %v: %d replacement lines, want 3, the last with %s:\n%s", ReplaceLogEvery, n, want, logs)
	}
}

// BenchmarkReplace is what replacing a node's registration costs the
// registry (the handshake before it aside).
func BenchmarkReplace(b *testing.B) {
	ca := testenv.MustCA(b, "tether test CA")
	kp, err := ca.NodeCert("edge-1")
	if err != nil {
		b.Fatal(err)
	}
	r := New(Options{ReplaceBurst: 1 << 30, ReplaceEvery: time.Nanosecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	conns := make([]*fakeConn, b.N+1)
	for i := range conns {
		conns[i] = newFakeConn(kp.Cert, i)
	}
	b.ResetTimer()
	for i := range b.N {
		if _, err := r.Register(conns[i]); err != nil {
			b.Fatal(err)
		}
	}
}
