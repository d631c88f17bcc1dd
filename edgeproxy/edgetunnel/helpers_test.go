package edgetunnel

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// testGateway is the least a gateway does: a QUIC listener with the
// tunnel's TLS that hands out the edges' connections and opens streams.
type testGateway struct {
	t        *testing.T
	addr     netip.AddrPort
	tr       *quic.Transport
	ln       *quic.Listener
	conns    chan *quic.Conn
	hellos   atomic.Int64 // TLS handshakes attempted
	busy     atomic.Bool  // refuse handshakes as a saturated gateway does
	mu       sync.Mutex
	accepted []*quic.Conn
}

// gatewayPKI is what a test gateway presents and trusts.
type gatewayPKI struct {
	serverCA *testenv.CA // issues the gateway's certificate
	clientCA *testenv.CA // verifies the edges' certificates
	names    []string    // the certificate's hosts
}

// startGateway listens on addr ("127.0.0.1:0" for a new port).
func startGateway(t *testing.T, pki gatewayPKI, addr string) *testGateway {
	t.Helper()
	names := pki.names
	if len(names) == 0 {
		names = []string{"127.0.0.1"}
	}
	srv, err := pki.serverCA.ServerCert("gateway", names...)
	if err != nil {
		t.Fatal(err)
	}
	g := &testGateway{t: t, conns: make(chan *quic.Conn, 16)}
	conf := tunnel.ServerTLS(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &srv.TLS, nil }, pki.clientCA.Pool())
	conf.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		g.hellos.Add(1)
		if g.busy.Load() {
			// As the gateway's handshake gate refuses: crypto/tls
			// answers internal_error.
			return nil, errors.New("gateway busy")
		}
		return nil, nil
	}
	// A Transport of our own, so that stop frees the port at once (a
	// listener from quic.ListenAddr keeps it while connections drain).
	udp, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.MustParseAddrPort(addr)))
	if err != nil {
		t.Fatal(err)
	}
	g.tr = &quic.Transport{Conn: udp}
	g.ln, err = g.tr.Listen(conf, tunnel.QUICConfig(tunnel.Limits{IdleTimeout: 3 * time.Second}))
	if err != nil {
		udp.Close()
		t.Fatal(err)
	}
	g.addr = udp.LocalAddr().(*net.UDPAddr).AddrPort()
	go func() {
		for {
			c, err := g.ln.Accept(context.Background())
			if err != nil {
				return
			}
			g.mu.Lock()
			g.accepted = append(g.accepted, c)
			g.mu.Unlock()
			g.conns <- c
		}
	}()
	t.Cleanup(g.stop)
	return g
}

// stop closes the edges' connections as a gateway shutting down does,
// and the listener.
func (g *testGateway) stop() {
	g.mu.Lock()
	for _, c := range g.accepted {
		c.CloseWithError(tunnel.CloseShutdown, "test gateway stopping")
	}
	g.mu.Unlock()
	g.ln.Close()
	g.tr.Close()
	g.tr.Conn.Close()
}

// nextConn waits for the next edge connection.
func (g *testGateway) nextConn() *quic.Conn {
	g.t.Helper()
	select {
	case c := <-g.conns:
		return c
	case <-time.After(10 * time.Second):
		g.t.Fatalf("gateway %s: no edge connected", g.addr)
		return nil
	}
}

// noConn checks that no edge connects before until holds: an event after
// which a connection would have come if the edge were going to make one.
func (g *testGateway) noConn(until func() bool) {
	g.t.Helper()
	testenv.Never(g.t, fmt.Sprintf("gateway %s: unexpected connection", g.addr),
		func() bool { return len(g.conns) > 0 }, until)
}

// open opens a stream asking for dest and reads the edge's reply.
func open(t *testing.T, c *quic.Conn, dest netip.AddrPort) (*quic.Stream, tunnel.Reply, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := c.OpenStreamSync(ctx)
	if err != nil {
		t.Fatalf("open stream: %v", err)
	}
	if err := tunnel.WriteRequest(s, tunnel.Request{Dest: dest, Client: "198.51.100.7:40000"}); err != nil {
		t.Fatalf("write request: %v", err)
	}
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	rep, err := tunnel.ReadReply(s)
	s.SetReadDeadline(time.Time{})
	return s, rep, err
}

// closedPort is a loopback port nothing listens on.
func closedPort(t *testing.T) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ap := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	return ap
}

// testLog sends log lines to the test's log and keeps them for checks.
type testLog struct {
	t   *testing.T
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.buf.Write(p)
	l.mu.Unlock()
	l.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func (l *testLog) contains(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.buf.String(), s)
}

// edge is a Client under test.
type edge struct {
	*Client
	reg *prometheus.Registry
	log *testLog

	mu        sync.Mutex
	retries   []retry // the supervisors' waits after failures, in order
	handovers []int64 // streams open at each handed-over connection's check
}

// retry is a supervisor's wait after a failure.
type retry struct {
	failure failure
	wait    time.Duration
}

// waits are the supervisors' waits after failures of kind f, in order.
func (e *edge) waits(f failure) []time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	var ws []time.Duration
	for _, r := range e.retries {
		if r.failure == f {
			ws = append(ws, r.wait)
		}
	}
	return ws
}

// handoverChecks counts the checks of handed-over connections that found
// a stream open on theirs.
func (e *edge) handoverChecks() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, open := range e.handovers {
		if open > 0 {
			n++
		}
	}
	return n
}

// startEdge runs a Client with o until the test ends. Unset TLS options
// default to a node certificate from nodeCA and trust in gwCA; backoff is
// short so reconnect tests take milliseconds.
func startEdge(t *testing.T, o Options, nodeCA, gwCA *testenv.CA) *edge {
	t.Helper()
	if o.Certificate == nil {
		kp, err := nodeCA.NodeCert("edge-1")
		if err != nil {
			t.Fatal(err)
		}
		o.Certificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &kp.TLS, nil }
	}
	if o.RootCAs == nil {
		o.RootCAs = gwCA.Pool
	}
	o.BackoffInitial = cmpOr(o.BackoffInitial, 20*time.Millisecond)
	o.BackoffMax = cmpOr(o.BackoffMax, 200*time.Millisecond)
	if o.LocalAddrs == nil {
		o.LocalAddrs = fakeAddrs{}
	}
	e := &edge{reg: prometheus.NewRegistry(), log: &testLog{t: t}}
	o.Registry = e.reg
	o.Logger = slog.New(slog.NewTextHandler(e.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	e.Client = c
	c.hooks.retry = func(f failure, wait time.Duration) {
		e.mu.Lock()
		e.retries = append(e.retries, retry{f, wait})
		e.mu.Unlock()
	}
	c.hooks.handover = func(open int64) {
		e.mu.Lock()
		e.handovers = append(e.handovers, open)
		e.mu.Unlock()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("Run did not return 10 s after its context ended")
		}
	})
	return e
}

// counter reads one series of a counter or gauge from the registry; -1
// if it is not there.
func (e *edge) metric(name string, labels ...string) float64 {
	mfs, err := e.reg.Gather()
	if err != nil {
		panic(err)
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
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
	}
	return -1
}

func (e *edge) status(gw netip.AddrPort) (statusapi.GatewayConnection, bool) {
	for _, s := range e.Status() {
		if s.Gateway == gw.String() {
			return s, true
		}
	}
	return statusapi.GatewayConnection{}, false
}

// fakeAddrs is an AddrSource with a settable list.
type fakeAddrs struct{ list *atomic.Pointer[[]netip.Addr] }

func (f fakeAddrs) Addrs() ([]netip.Addr, error) {
	if f.list == nil || f.list.Load() == nil {
		return nil, nil
	}
	return *f.list.Load(), nil
}

// fakeResolver answers every name with a settable list.
type fakeResolver struct {
	mu      sync.Mutex
	addrs   []netip.Addr
	err     error
	lookups int
}

// looked counts the lookups so far.
func (f *fakeResolver) looked() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lookups
}

func (f *fakeResolver) set(addrs []netip.Addr, err error) {
	f.mu.Lock()
	f.addrs, f.err = addrs, err
	f.mu.Unlock()
}

func (f *fakeResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lookups++
	return f.addrs, f.err
}

// writeNodePEM writes a new certificate of node from ca, with its key, to
// path (one file, as the kubelet keeps kubelet-client-current.pem), with
// the modification time mtime.
func writeNodePEM(t *testing.T, ca *testenv.CA, path, node string, mtime time.Time) *testenv.KeyPair {
	t.Helper()
	kp, err := ca.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(kp.CertPEM, kp.KeyPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mtime, mtime); err != nil {
		t.Fatal(err)
	}
	return kp
}
