package edgetunnel

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/internal/certfile"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// setup is one CA for everything, a gateway, a destination server, and an
// edge allowed to reach that server's port.
func setup(t *testing.T, o Options) (*testenv.CA, *testGateway, *edge, netip.AddrPort) {
	t.Helper()
	ca := testenv.MustCA(t, "edgetunnel-test")
	gw := startGateway(t, gatewayPKI{serverCA: ca, clientCA: ca}, "127.0.0.1:0")
	dest := testenv.GotServer(t)
	o.Gateways = []string{gw.addr.String()}
	if o.AllowPorts == nil {
		o.AllowPorts = []uint16{dest.Port()}
	}
	return ca, gw, startEdge(t, o, ca, ca), dest
}

func TestRelayBothWaysWithHalfClose(t *testing.T) {
	_, gw, e, dest := setup(t, Options{})
	conn := gw.nextConn()
	if name, err := tunnel.NodeName(conn.ConnectionState().TLS.PeerCertificates[0]); err != nil || name != "edge-1" {
		t.Fatalf("gateway sees node %q, %v", name, err)
	}

	s, rep, err := open(t, conn, dest)
	if err != nil || rep.Code != tunnel.OK {
		t.Fatalf("reply %+v, %v", rep, err)
	}
	// The server answers only after EOF: the stream's FIN must reach it
	// as a TCP half-close, and its answer must still come back.
	req := bytes.Repeat([]byte("ping "), 50_000)
	if _, err := s.Write(req); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(s)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	if want := append([]byte("got "), req...); !bytes.Equal(got, want) {
		t.Fatalf("answer is %d bytes, want %d", len(got), len(want))
	}

	testenv.Eventually(t, "byte counts", func() bool {
		st, _ := e.status(gw.addr)
		return st.BytesDown == int64(len(req)) && st.BytesUp == int64(len(got)) && st.StreamsOpen == 0
	})
	if v := e.metric("tether_edge_tunnel_streams_total", "result", "ok"); v != 1 {
		t.Errorf("streams_total{result=ok} = %v, want 1", v)
	}
	if v := e.metric("tether_edge_tunnel_gateway_bytes_total", "gateway", gw.addr.String(), "direction", "down"); v != float64(len(req)) {
		t.Errorf("bytes_total{direction=down} = %v, want %d", v, len(req))
	}
	if v := e.metric("tether_edge_tunnel_gateway_connected", "gateway", gw.addr.String()); v != 1 {
		t.Errorf("gateway_connected = %v, want 1", v)
	}
	if v := e.metric("tether_edge_tunnel_gateway_rtt_seconds", "gateway", gw.addr.String()); v <= 0 {
		t.Errorf("gateway_rtt_seconds = %v, want > 0", v)
	}
	if err := e.Ready(); err != nil {
		t.Errorf("Ready: %v", err)
	}
}

func TestRefusals(t *testing.T) {
	closed := closedPort(t)
	_, gw, e, dest := setup(t, Options{AllowPorts: []uint16{closed.Port()}})
	conn := gw.nextConn()
	for _, tc := range []struct {
		name string
		dest netip.AddrPort
		code tunnel.Code
		msg  string
	}{
		// dest's port is not allowed in this test (AllowPorts above).
		{"port not allowed", dest, tunnel.NotAllowed, "not in --allow-ports"},
		{"address not the node's", netip.AddrPortFrom(netip.MustParseAddr("192.0.2.1"), closed.Port()), tunnel.NotAllowed, "not an address of this node"},
		{"nothing listening", closed, tunnel.DialFailed, "refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, rep, err := open(t, conn, tc.dest)
			var re *tunnel.RefusedError
			if !errors.As(err, &re) || rep.Code != tc.code || !strings.Contains(rep.Message, tc.msg) {
				t.Fatalf("reply %+v, err %v; want %v with %q", rep, err, tc.code, tc.msg)
			}
			// After a refusal the stream ends.
			if b, err := io.ReadAll(s); err != nil || len(b) != 0 {
				t.Errorf("after the refusal: %q, %v; want EOF", b, err)
			}
		})
	}
	if v := e.metric("tether_edge_tunnel_streams_total", "result", "not_allowed"); v != 2 {
		t.Errorf("streams_total{result=not_allowed} = %v, want 2", v)
	}
	if v := e.metric("tether_edge_tunnel_streams_total", "result", "dial_failed"); v != 1 {
		t.Errorf("streams_total{result=dial_failed} = %v, want 1", v)
	}
	if !e.log.contains("stream refused") || !e.log.contains("client=198.51.100.7:40000") {
		t.Errorf("refusals not logged with their client")
	}
}

func TestBadRequest(t *testing.T) {
	_, gw, e, _ := setup(t, Options{HeaderTimeout: 200 * time.Millisecond})
	conn := gw.nextConn()
	for name, write := range map[string][]byte{
		"version 9":       {9, 1, 0, 0},
		"header too long": {1, 1, 0xff, 0xff},
		"incomplete":      {1}, // and then nothing until the header timeout
	} {
		t.Run(name, func(t *testing.T) {
			s, err := conn.OpenStream()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Write(write); err != nil {
				t.Fatal(err)
			}
			s.SetReadDeadline(time.Now().Add(5 * time.Second))
			rep, err := tunnel.ReadReply(s)
			if rep.Code != tunnel.BadRequest {
				t.Fatalf("reply %+v, %v; want bad_request", rep, err)
			}
		})
	}
	if v := e.metric("tether_edge_tunnel_streams_total", "result", "bad_request"); v != 3 {
		t.Errorf("streams_total{result=bad_request} = %v, want 3", v)
	}
}

func TestOverloaded(t *testing.T) {
	_, gw, e, dest := setup(t, Options{MaxStreams: 1})
	conn := gw.nextConn()
	first, rep, err := open(t, conn, dest) // held open: the server waits for EOF
	if err != nil || rep.Code != tunnel.OK {
		t.Fatalf("first stream: %+v, %v", rep, err)
	}
	_, rep, err = open(t, conn, dest)
	if rep.Code != tunnel.Overloaded {
		t.Fatalf("second stream: %+v, %v; want overloaded", rep, err)
	}
	if v := e.metric("tether_edge_tunnel_streams_total", "result", "overloaded"); v != 1 {
		t.Errorf("streams_total{result=overloaded} = %v, want 1", v)
	}
	// Once the first is done, its slot is free again.
	first.Close()
	io.ReadAll(first)
	testenv.Eventually(t, "slot freed", func() bool {
		st, _ := e.status(gw.addr)
		return st.StreamsOpen == 0
	})
	if _, rep, err := open(t, conn, dest); rep.Code != tunnel.OK {
		t.Fatalf("third stream: %+v, %v; want ok", rep, err)
	}
}

func TestReconnectAfterGatewayRestart(t *testing.T) {
	ca, gw, e, dest := setup(t, Options{})
	gw.nextConn()
	addr := gw.addr
	gw.stop()
	testenv.Eventually(t, "disconnect noticed", func() bool {
		st, _ := e.status(addr)
		return !st.Connected
	})

	start := time.Now()
	gw2 := startGateway(t, gatewayPKI{serverCA: ca, clientCA: ca}, addr.String())
	conn := gw2.nextConn()
	t.Logf("reconnected %v after the restart", time.Since(start))
	if _, rep, err := open(t, conn, dest); rep.Code != tunnel.OK {
		t.Fatalf("after reconnect: %+v, %v", rep, err)
	}
	st, _ := e.status(addr)
	if !st.Connected || st.Reconnects < 1 {
		t.Errorf("status %+v, want connected with a reconnect counted", st)
	}
}

func TestTwoReplicas(t *testing.T) {
	ca := testenv.MustCA(t, "edgetunnel-test")
	pki := gatewayPKI{serverCA: ca, clientCA: ca}
	gwA := startGateway(t, pki, "127.0.0.1:0")
	gwB := startGateway(t, pki, "127.0.0.1:0")
	dest := testenv.GotServer(t)
	e := startEdge(t, Options{
		Gateways:   []string{gwA.addr.String(), gwB.addr.String(), gwA.addr.String()}, // a duplicate is one replica
		AllowPorts: []uint16{dest.Port()},
	}, ca, ca)
	connA, connB := gwA.nextConn(), gwB.nextConn()
	if n := len(e.Status()); n != 2 {
		t.Fatalf("%d replicas in status, want 2", n)
	}
	for _, c := range []*quic.Conn{connA, connB} {
		if _, rep, err := open(t, c, dest); rep.Code != tunnel.OK {
			t.Fatalf("via %s: %+v, %v", c.LocalAddr(), rep, err)
		}
	}
	// A supervisor for the duplicate would have dialled as the others did,
	// before they answered the streams above.
	answered := func() bool { return true }
	gwA.noConn(answered)
	gwB.noConn(answered)

	gwA.stop()
	testenv.Eventually(t, "replica A down", func() bool {
		st, _ := e.status(gwA.addr)
		return !st.Connected
	})
	s, rep, err := open(t, connB, dest)
	if rep.Code != tunnel.OK {
		t.Fatalf("via B after A stopped: %+v, %v", rep, err)
	}
	s.Write([]byte("still here"))
	s.Close()
	if got, _ := io.ReadAll(s); string(got) != "got still here" {
		t.Errorf("via B: %q", got)
	}
	if err := e.Ready(); err != nil {
		t.Errorf("Ready with one replica up: %v", err)
	}
}

func TestResolverChanges(t *testing.T) {
	ca := testenv.MustCA(t, "edgetunnel-test")
	pki := gatewayPKI{serverCA: ca, clientCA: ca, names: []string{"gw.test"}}
	gwA := startGateway(t, pki, "127.0.0.1:0")
	port := gwA.addr.Port()
	gwB := startGateway(t, pki, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), port).String())
	a, b := gwA.addr.Addr(), gwB.addr.Addr()

	res := &fakeResolver{}
	res.set([]netip.Addr{a}, nil)
	e := startEdge(t, Options{
		Gateways:        []string{"gw.test:" + strconv.Itoa(int(port))},
		AllowPorts:      []uint16{1},
		Resolver:        res,
		ResolveInterval: 50 * time.Millisecond,
	}, ca, ca)
	connA := gwA.nextConn()

	res.set([]netip.Addr{a, b}, nil) // a replica added
	connB := gwB.nextConn()
	n := res.looked()
	gwA.noConn(func() bool { return res.looked() > n }) // reconciled again

	res.set(nil, errors.New("SERVFAIL")) // a failing lookup keeps what we have
	n = res.looked()
	testenv.Never(t, "a replica dropped after a failed lookup", func() bool {
		return len(e.Status()) != 2 || connA.Context().Err() != nil
	}, func() bool { return res.looked() > n+1 }) // the failed lookup's result applied

	res.set([]netip.Addr{b}, nil) // a replica gone
	select {
	case <-connA.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("connection to the vanished replica not closed")
	}
	if st := e.Status(); len(st) != 1 || st[0].Gateway != gwB.addr.String() || st[0].ServerName != "gw.test" {
		t.Fatalf("status %+v, want only %s", st, gwB.addr)
	}
	if connB.Context().Err() != nil {
		t.Fatal("connection to the remaining replica closed")
	}
}

func TestGatewayFromAnotherCAIsRefused(t *testing.T) {
	ca := testenv.MustCA(t, "edgetunnel-test")
	other := testenv.MustCA(t, "someone-else")
	gw := startGateway(t, gatewayPKI{serverCA: other, clientCA: ca}, "127.0.0.1:0")
	e := startEdge(t, Options{Gateways: []string{gw.addr.String()}, AllowPorts: []uint16{1}}, ca, ca)
	testenv.Eventually(t, "a failed handshake", func() bool {
		st, _ := e.status(gw.addr)
		return st.LastError != "" && gw.hellos.Load() > 0
	})
	gw.noConn(func() bool { return len(e.waits(gatewayUntrusted)) >= 2 })
	st, _ := e.status(gw.addr)
	if st.Connected || !strings.Contains(st.LastError, "certificate") {
		t.Errorf("status %+v, want not connected with a certificate error", st)
	}
}

func TestRefusedIdentityBacksOff(t *testing.T) {
	for _, tc := range []struct {
		name string
		// wrongCA: the gateway trusts another CA than the edge's (a TLS
		// alert); otherwise it accepts the handshake and then closes
		// the connection with CloseNotAllowed.
		wrongCA bool
	}{
		{"TLS alert", true},
		{"closed as not allowed", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca := testenv.MustCA(t, "edgetunnel-test")
			clientCA := ca
			if tc.wrongCA {
				clientCA = testenv.MustCA(t, "other-nodes")
			}
			gw := startGateway(t, gatewayPKI{serverCA: ca, clientCA: clientCA}, "127.0.0.1:0")
			if !tc.wrongCA {
				go func() {
					for {
						select {
						case c := <-gw.conns:
							c.CloseWithError(tunnel.CloseNotAllowed, "no such node")
						case <-t.Context().Done():
							return
						}
					}
				}()
			}
			clk := clocktesting.NewFakeClock(time.Now())
			e := startEdge(t, Options{
				Gateways: []string{gw.addr.String()}, AllowPorts: []uint16{1},
				Clock: clk, BackoffInitial: time.Second, BackoffMax: time.Minute,
			}, ca, ca)
			// Once the refusal is seen, the supervisor waits for the fake
			// clock: no tight loop.
			testenv.Never(t, "a second handshake before the backoff elapsed",
				func() bool { return gw.hellos.Load() > 1 },
				func() bool { return len(e.waits(identityRefused)) > 0 })
			testenv.Eventually(t, "a retry once the backoff elapsed", func() bool {
				clk.Step(100 * time.Millisecond)
				return gw.hellos.Load() >= 2
			})
		})
	}
}

// A gateway that refuses the handshake as busy is dialled again after at
// least busyBackoff/2, not after the first backoff of 200 ms; refused
// again and again, the edge waits [busyBackoffMax/2, busyBackoffMax) each
// time, not the 15 to 30 s its backoff would grow to.
func TestBusyGatewayBacksOff(t *testing.T) {
	ca := testenv.MustCA(t, "edgetunnel-test")
	gw := startGateway(t, gatewayPKI{serverCA: ca, clientCA: ca}, "127.0.0.1:0")
	gw.busy.Store(true)
	clk := clocktesting.NewFakeClock(time.Now())
	e := startEdge(t, Options{
		Gateways: []string{gw.addr.String()}, AllowPorts: []uint16{1},
		Clock: clk, BackoffInitial: 200 * time.Millisecond, BackoffMax: time.Minute,
	}, ca, ca)
	testenv.Eventually(t, "a busy refusal", func() bool { return len(e.waits(gatewayBusy)) > 0 })
	wait := e.waits(gatewayBusy)[0]
	if wait < busyBackoff/2 || wait >= busyBackoff {
		t.Fatalf("retry in %v after a busy refusal, want within [%v, %v)", wait, busyBackoff/2, busyBackoff)
	}
	const refusals = 6
	var waits []time.Duration
	for n := 1; n < refusals; n++ {
		testenv.Eventually(t, fmt.Sprintf("busy refusal %d", n+1), func() bool {
			clk.Step(busyBackoffMax) // past any wait, which the hook records
			waits = e.waits(gatewayBusy)
			return len(waits) > n
		})
	}
	for i, w := range waits[1:] {
		if w < busyBackoffMax/2 || w >= busyBackoffMax {
			t.Fatalf("retry in %v after busy refusal %d, want within [%v, %v) (all: %v)", w, i+2, busyBackoffMax/2, busyBackoffMax, waits)
		}
	}
	t.Logf("waits after %d busy refusals: %v", len(waits), waits)
	gw.busy.Store(false)
	testenv.Eventually(t, "connected once the backoff elapsed", func() bool {
		clk.Step(busyBackoffMax)
		st, ok := e.status(gw.addr)
		return ok && st.Connected
	})
}

func TestRotatedCertificateUsedForNextConnection(t *testing.T) {
	ca := testenv.MustCA(t, "edgetunnel-test")
	gw := startGateway(t, gatewayPKI{serverCA: ca, clientCA: ca}, "127.0.0.1:0")
	// One file holding both certificate and key, as the kubelet keeps
	// kubelet-client-current.pem.
	pem := filepath.Join(t.TempDir(), "kubelet-client-current.pem")
	write := func(node string, mtime time.Time) { writeNodePEM(t, ca, pem, node, mtime) }
	now := time.Now()
	write("edge-old", now.Add(-time.Hour))
	certs, err := certfile.LoadKeyPair(pem, pem, certfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if cert, _ := certs.Certificate(); cert == nil {
		t.Fatal("no certificate loaded")
	} else if name, err := tunnel.NodeName(cert.Leaf); err != nil || name != "edge-old" {
		t.Fatalf("NodeName = %q, %v", name, err)
	}
	startEdge(t, Options{Gateways: []string{gw.addr.String()}, AllowPorts: []uint16{1}, Certificate: certs.GetClientCertificate}, ca, ca)
	peer := func(c *quic.Conn) string {
		name, _ := tunnel.NodeName(c.ConnectionState().TLS.PeerCertificates[0])
		return name
	}
	c1 := gw.nextConn()
	if got := peer(c1); got != "edge-old" {
		t.Fatalf("first connection as %q", got)
	}

	write("edge-new", now)
	c1.CloseWithError(tunnel.CloseNormal, "")
	if got := peer(gw.nextConn()); got != "edge-new" {
		t.Fatalf("connection after rotation as %q, want edge-new", got)
	}
}

// Rotate moves the tunnel to a new connection that presents the new
// certificate; a stream open on the old connection goes on, and the old
// connection ends once it has no stream.
func TestRotateHandsOver(t *testing.T) {
	ca := testenv.MustCA(t, "edgetunnel-test")
	gw := startGateway(t, gatewayPKI{serverCA: ca, clientCA: ca}, "127.0.0.1:0")
	dest := testenv.GotServer(t)
	pem := filepath.Join(t.TempDir(), "kubelet-client-current.pem")
	write := func(mtime time.Time) *testenv.KeyPair { return writeNodePEM(t, ca, pem, "edge-1", mtime) }
	now := time.Now()
	first := write(now.Add(-time.Hour))
	certs, err := certfile.LoadKeyPair(pem, pem, certfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := startEdge(t, Options{Gateways: []string{gw.addr.String()}, AllowPorts: []uint16{dest.Port()},
		Certificate: certs.GetClientCertificate, HandoverGrace: 200 * time.Millisecond}, ca, ca)
	serial := func(c *quic.Conn) string { return c.ConnectionState().TLS.PeerCertificates[0].SerialNumber.String() }
	c1 := gw.nextConn()
	if serial(c1) != first.Cert.SerialNumber.String() {
		t.Fatal("first connection without the first certificate")
	}
	s1, rep, err := open(t, c1, dest)
	if err != nil || rep.Code != tunnel.OK {
		t.Fatalf("reply %+v, %v", rep, err)
	}
	if _, err := s1.Write([]byte("before ")); err != nil {
		t.Fatal(err)
	}

	second := write(now)
	e.Rotate()
	c2 := gw.nextConn()
	if serial(c2) != second.Cert.SerialNumber.String() {
		t.Fatal("connection after Rotate without the new certificate")
	}
	// Past the grace, the old connection is still up: it relays s1.
	testenv.Never(t, "old connection ended with a stream open",
		func() bool { return c1.Context().Err() != nil },
		func() bool { return e.handoverChecks() > 0 })
	if _, err := s1.Write([]byte("and after the rotation")); err != nil {
		t.Fatal(err)
	}
	s1.Close()
	s1.SetReadDeadline(time.Now().Add(10 * time.Second))
	if got, err := io.ReadAll(s1); err != nil || string(got) != "got before and after the rotation" {
		t.Fatalf("stream across the rotation: %q, %v", got, err)
	}
	// A new stream works on the new connection.
	s2, rep, err := open(t, c2, dest)
	if err != nil || rep.Code != tunnel.OK {
		t.Fatalf("new connection: reply %+v, %v", rep, err)
	}
	s2.Close()
	io.ReadAll(s2)
	// With no stream left, the edge closes the old connection.
	select {
	case <-c1.Context().Done():
	case <-time.After(10 * time.Second):
		t.Fatal("old connection still up 10 s after its last stream ended")
	}
	if err := c2.Context().Err(); err != nil {
		t.Fatalf("new connection ended: %v", context.Cause(c2.Context()))
	}
	gw.noConn(func() bool { // no reconnection: the new one serves
		s, rep, err := open(t, c2, dest)
		if err != nil || rep.Code != tunnel.OK {
			t.Fatalf("new connection after the old one ended: reply %+v, %v", rep, err)
		}
		s.Close()
		io.ReadAll(s)
		return true
	})
	if n := e.metric("tether_edge_tunnel_gateway_reconnects_total", "gateway", gw.addr.String()); n != 0 {
		t.Errorf("a rotation counted as %v reconnections", n)
	}
}

// A gateway whose CA the edge learns later (the --gateway-ca file
// rotated): the next connection attempt uses the new CAs, without a
// restart.
func TestRootCAsAskedAtEachConnection(t *testing.T) {
	ca := testenv.MustCA(t, "edgetunnel-test")
	gwCA := testenv.MustCA(t, "new-gateway-ca")
	gw := startGateway(t, gatewayPKI{serverCA: gwCA, clientCA: ca}, "127.0.0.1:0")
	var roots atomic.Pointer[x509.CertPool]
	roots.Store(ca.Pool())
	e := startEdge(t, Options{Gateways: []string{gw.addr.String()}, AllowPorts: []uint16{1},
		RootCAs: func() *x509.CertPool { return roots.Load() }}, ca, ca)
	testenv.Eventually(t, "a refused handshake", func() bool {
		st, _ := e.status(gw.addr)
		return st.LastError != "" && gw.hellos.Load() > 0
	})
	roots.Store(gwCA.Pool())
	gw.nextConn()
	testenv.Eventually(t, "connected", func() bool {
		st, _ := e.status(gw.addr)
		return st.Connected
	})
}
