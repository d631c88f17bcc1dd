package e2e

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// Hardening: certificates rotate without a restart or a dropped tunnel,
// and every hostile peer is refused with a logged reason and a counter
// while the honest edges keep working. SECURITY.md points here.

// TestCertificateRotation: the gateway's serving certificate and an
// edge's client certificate are rotated on disk while a relayed connection
// is open. It goes on to its last byte, and new connections use the new
// certificates: the edge moves its tunnels to new connections, and the
// gateway closes the old one once its last stream is done.
func TestCertificateRotation(t *testing.T) {
	w := newWorld(t, world.Options{Gateways: 2}, "--netrules", "nftables")
	gw1 := w.Gateways[0]
	e := w.Edges[0]
	for _, gw := range w.Gateways {
		testenv.EventuallyWithin(t, 10*time.Second, "both edges on "+gw.Label, func() bool { return len(gatewayStatus(t, gw).Edges) == 2 })
	}
	since := connectedSince(t, gw1, e.Name)

	// The connection that stays open through both rotations: 64 MiB from
	// edge-1's kubelet through gw1, read a little at a time.
	const n = 64 << 20
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	body := openDownload(t, ctx, w, e, n)
	h := sha256.New()
	read := func(k int64) {
		t.Helper()
		if _, err := io.CopyN(h, body, k); err != nil {
			t.Fatalf("the open connection broke: %v", err)
		}
	}
	read(1 << 20)

	t.Run("gateway serving certificate", func(t *testing.T) {
		next, err := w.GatewayCA.ServerCert(gw1.Label, gw1.Addr.String(), gw1.Label)
		if err != nil {
			t.Fatal(err)
		}
		// In place, certificate first: between the two writes the pair
		// does not match and the gateway keeps the old one.
		writeFile(t, w.Path(gw1.Label+"-serving.crt"), next.CertPEM)
		writeFile(t, w.Path(gw1.Label+"-serving.key"), next.KeyPEM)
		read(1 << 20)

		// A new connection to gw1, from edge-1's site, gets the new one.
		probe, err := w.ClusterCA.NodeCert("rotation-probe")
		if err != nil {
			t.Fatal(err)
		}
		conn, err := dialTunnel(ctx, e.Host, gw1, probe.TLS, w.GatewayCA.Pool())
		if err != nil {
			t.Fatal(err)
		}
		got := conn.ConnectionState().TLS.PeerCertificates[0]
		conn.CloseWithError(tunnel.CloseNormal, "")
		if got.SerialNumber.Cmp(next.Cert.SerialNumber) != 0 {
			t.Fatalf("a new connection got serving certificate %x, want the rotated %x", got.SerialNumber, next.Cert.SerialNumber)
		}
		if !strings.Contains(w.Log(gw1), "certificate files changed; new handshakes use them") {
			t.Error("gw1 did not log the reload")
		}
		if got := connectedSince(t, gw1, e.Name); !got.Equal(since) {
			t.Errorf("edge-1's tunnel to gw1 was replaced (connected since %v, was %v)", got, since)
		}
	})

	t.Run("edge client certificate", func(t *testing.T) {
		next, err := w.ClusterCA.NodeCert(e.Name)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, e.CertFile, next.CertPEM)
		writeFile(t, e.KeyFile, next.KeyPEM)

		// edge-1 notices (--cert-check-interval 1s in this world) and
		// moves each tunnel to a new connection with the new
		// certificate; the old connection to gw1 keeps relaying the open
		// download.
		serial := "cert_serial=" + next.Cert.SerialNumber.Text(16)
		for _, gw := range w.Gateways {
			testenv.EventuallyWithin(t, 30*time.Second, "edge-1 on "+gw.Label+" with its new certificate", func() bool {
				for _, line := range strings.Split(w.Log(gw), "\n") {
					if strings.Contains(line, "edge connected") && strings.Contains(line, "node="+e.Name) && strings.Contains(line, serial) {
						return true
					}
				}
				return false
			})
		}
		if got := connectedSince(t, gw1, e.Name); !got.After(since) {
			t.Errorf("edge-1's registration on gw1 is still the one from %v", got)
		}
		read(1 << 20)
	})

	// The open connection ends intact.
	if _, err := io.Copy(h, body); err != nil {
		t.Fatalf("the open connection broke: %v", err)
	}
	want := sha256.New()
	io.CopyN(want, world.Pattern{}, n)
	if hex.EncodeToString(h.Sum(nil)) != hex.EncodeToString(want.Sum(nil)) {
		t.Fatal("the bytes of the open connection differ from the kubelet's")
	}
	if err := reachable(w, e); err != nil {
		t.Errorf("edge-1 after the rotations: %v", err)
	}
	// Its last stream done (the download's connection closes after the
	// response), the replaced connection to gw1 is closed.
	testenv.EventuallyWithin(t, 30*time.Second, "gw1 closing edge-1's replaced connection", func() bool {
		for _, line := range strings.Split(w.Log(gw1), "\n") {
			if strings.Contains(line, "edge disconnected") && strings.Contains(line, "node="+e.Name) && strings.Contains(line, "replaced by a newer connection") {
				return true
			}
		}
		return false
	})
}

// TestSelfManagedCertificate: a gateway given no --tls-cert/--tls-key
// issues its serving certificate from a CA of its own in --data-dir;
// `tetherctl ca` gives the edges that CA, and they connect with it.
func TestSelfManagedCertificate(t *testing.T) {
	testenv.RequireRoot(t)
	ctl := bins.Ctl
	w := world.New(t, bins, world.Options{}, t.Logf)
	gw := w.Gateways[0]
	dataDir := t.TempDir()
	// The world's --tls-cert/--tls-key, emptied: later flags win.
	w.StartGateway(t, gw, "--netrules", "nftables", "--tls-cert", "", "--tls-key", "",
		"--data-dir", dataDir, "--server-name", gw.Addr.String()+","+gw.Label)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	admin := fmt.Sprintf("http://%s:%d", gw.Addr, world.AdminPort)
	var bundle []byte
	testenv.EventuallyWithin(t, 10*time.Second, "tetherctl ca", func() bool {
		out, err := w.Client.Command(ctx, ctl, "ca", "--gateway", admin).Output()
		bundle = out
		return err == nil
	})
	local, err := os.ReadFile(dataDir + "/ca.crt")
	if err != nil {
		t.Fatal(err)
	}
	if string(bundle) != string(local) {
		t.Fatalf("tetherctl ca printed:\n%s\nthe data dir's ca.crt is:\n%s", bundle, local)
	}
	if out, err := exec.CommandContext(ctx, ctl, "ca", "--data-dir", dataDir).Output(); err != nil || string(out) != string(local) {
		t.Fatalf("tetherctl ca --data-dir: %v: %s", err, out)
	}

	// The edges trust that CA only.
	writeFile(t, w.Path("gateway-ca.crt"), bundle)
	for _, e := range w.Edges {
		w.StartEdge(t, e)
	}
	w.RouteSitesVia(t, gw)
	if err := w.WaitReachable(ctx, 30*time.Second); err != nil {
		t.Fatalf("%v\ngateway log:\n%s", err, w.Log(gw))
	}
	wantLog(t, w.Log(gw), "self-managed TLS", "data_dir="+dataDir)
}

// TestHostilePeers: each hostile peer is refused, with its reason in a
// log and a counter, and nothing else is disturbed: both honest edges stay
// connected (same tunnels) and reachable. Other hostile peers have tests
// of their own: a certificate from another CA, none, and another node's
// certificate (TestIdentity); destinations outside the allow list
// (TestAllowList).
func TestHostilePeers(t *testing.T) {
	w := newWorld(t, world.Options{}, "--netrules", "nftables", "--max-streams-per-edge", "3")
	gw := w.Gateways[0]
	e1, e2 := w.Edges[0], w.Edges[1]
	ctx := context.Background()
	since := map[string]time.Time{e1.Name: connectedSince(t, gw, e1.Name), e2.Name: connectedSince(t, gw, e2.Name)}
	undisturbed := func(t *testing.T) {
		t.Helper()
		for _, e := range w.Edges {
			if got := connectedSince(t, gw, e.Name); !got.Equal(since[e.Name]) {
				t.Errorf("%s's tunnel was replaced or dropped (connected since %v, was %v)", e.Name, got, since[e.Name])
			}
			if err := reachable(w, e); err != nil {
				t.Errorf("%s: %v", e.Name, err)
			}
		}
	}

	t.Run("expired client certificate", func(t *testing.T) {
		// edge-1's own name, from the cluster CA, expired an hour ago: an
		// old key that leaked.
		kp, err := w.ClusterCA.Issue(testenv.Template{
			CommonName: "system:node:" + e1.Name, Organizations: []string{"system:nodes"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			NotBefore:   time.Now().Add(-30 * 24 * time.Hour), NotAfter: time.Now().Add(-time.Hour),
		})
		if err != nil {
			t.Fatal(err)
		}
		conn, err := dialTunnel(ctx, e1.Host, gw, kp.TLS, w.GatewayCA.Pool())
		if !refusedInHandshake(conn, err) {
			t.Fatalf("an expired certificate was not refused in the handshake: %v", err)
		}
		waitForMetric(t, gw, `tether_gateway_tunnel_connections_total{result="expired"}`, 1)
		wantLog(t, w.Log(gw), "tunnel refused: client certificate not accepted", "reason=expired")
		undisturbed(t)
	})

	t.Run("certificate without the system:node: prefix", func(t *testing.T) {
		// Signed by the cluster CA, in group system:nodes, but not a node
		// user: any other client identity of the cluster.
		kp, err := w.ClusterCA.ClientCert(e1.Name, "system:nodes")
		if err != nil {
			t.Fatal(err)
		}
		conn, err := dialTunnel(ctx, e1.Host, gw, kp.TLS, w.GatewayCA.Pool())
		if err != nil {
			t.Fatalf("the chain is valid, the handshake should pass: %v", err)
		}
		select {
		case <-conn.Context().Done():
		case <-time.After(5 * time.Second):
			t.Fatal("a tunnel of a non-node identity stayed up")
		}
		var ae *quic.ApplicationError
		if err := context.Cause(conn.Context()); !errors.As(err, &ae) || !ae.Remote || ae.ErrorCode != tunnel.CloseNotAllowed {
			t.Fatalf("closed with %v, want the gateway's CloseNotAllowed", err)
		}
		waitForMetric(t, gw, `tether_gateway_tunnel_connections_total{result="not_a_node"}`, 1)
		wantLog(t, w.Log(gw), "tunnel refused: client certificate names no node", "reason=not_a_node")
		undisturbed(t)
	})

	t.Run("slowloris on the transparent listener", func(t *testing.T) {
		// Clients that dial the gateway's own address are routed by the
		// name in their first bytes. These send a ClientHello for edge-1
		// one byte a second: none gets a stream, each is cut at the peek
		// deadline, while an honest client is served beside them.
		const slow = 5
		hello := testenv.ClientHello(t, e1.Name)
		okBefore := edgeMetric(t, e1.Host, `tether_edge_tunnel_streams_total{result="ok"}`)
		timeoutsBefore := gatewayMetric(t, gw, `tether_gateway_proxy_refusals_total{reason="peek_timeout"}`)
		addr := netip.AddrPortFrom(gw.Addr, world.ProxyPort).String()
		var wg sync.WaitGroup
		results := make(chan string, slow)
		for range slow {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results <- slowClient(ctx, w.Client, addr, hello)
			}()
		}
		var served atomic.Int64
		honestDone := make(chan struct{})
		go func() {
			defer close(honestDone)
			url := fmt.Sprintf("https://%s:%d/healthz", e1.Name, world.ProxyPort)
			for range 5 {
				out, err := w.Curl(ctx, url, "--resolve", fmt.Sprintf("%s:%d:%s", e1.Name, world.ProxyPort, gw.Addr), "--max-time", "3")
				if err == nil && strings.TrimSpace(out) == "ok "+e1.Name {
					served.Add(1)
				} else {
					t.Errorf("the honest client beside the slow ones: %v: %s", err, out)
				}
				time.Sleep(time.Second)
			}
		}()
		wg.Wait()
		close(results)
		<-honestDone
		for r := range results {
			if r != "" {
				t.Error(r)
			}
		}
		waitForMetric(t, gw, `tether_gateway_proxy_refusals_total{reason="peek_timeout"}`, timeoutsBefore+slow)
		// Only the honest client's connections reached the edge.
		if got := edgeMetric(t, e1.Host, `tether_edge_tunnel_streams_total{result="ok"}`) - okBefore; got != float64(served.Load()) {
			t.Errorf("edge-1 relayed %v streams, want %d (the honest client's only)", got, served.Load())
		}
		wantLog(t, w.Log(gw), "connection refused", "reason=peek_timeout")
		undisturbed(t)
	})

	t.Run("DNS recursion request", func(t *testing.T) {
		before := gatewayMetric(t, gw, `tether_gateway_dns_queries_total{rcode="REFUSED"}`)
		out := dig(t, w.Client, gw, "+recurse", "example.com.", "A")
		if !strings.Contains(out, "status: REFUSED") || strings.Contains(out, "ANSWER SECTION") {
			t.Fatalf("a recursion request was not refused:\n%s", out)
		}
		waitForMetric(t, gw, `tether_gateway_dns_queries_total{rcode="REFUSED"}`, before+1)
		// The gateway's own names are still answered.
		if out := dig(t, w.Client, gw, "+short", e1.Name+".", "A"); strings.TrimSpace(out) != e1.Host.Addr.String() {
			t.Errorf("%s A = %q, want %s", e1.Name, out, e1.Host.Addr)
		}
		undisturbed(t)
	})

	t.Run("stream flood beyond the gateway's per-edge limit", func(t *testing.T) {
		// --max-streams-per-edge 3: three held connections fill edge-1's
		// slots; the fourth is refused as overloaded after a second.
		hold := holdConnections(t, w, e1, 3)
		refused := gatewayMetric(t, gw, `tether_gateway_proxy_refusals_total{reason="overloaded"}`)
		if err := reachable(w, e1); err == nil {
			t.Fatal("a fourth connection to edge-1 went through")
		}
		waitForMetric(t, gw, `tether_gateway_proxy_refusals_total{reason="overloaded"}`, refused+1)
		if v := gatewayMetric(t, gw, fmt.Sprintf(`tether_gateway_edge_refusals_total{node=%q,reason="overloaded"}`, e1.Name)); v != 1 {
			t.Errorf("edge-1's overloaded refusals = %v, want 1", v)
		}
		wantLog(t, w.Log(gw), "connection refused", "reason=overloaded", "node="+e1.Name)
		if err := reachable(w, e2); err != nil {
			t.Errorf("edge-2 while edge-1 is full: %v", err)
		}
		hold()
		testenv.EventuallyWithin(t, 10*time.Second, "edge-1 reachable once the connections are gone", func() bool { return reachable(w, e1) == nil })
		undisturbed(t)
	})

	t.Run("header over the limit, and streams beyond the edge's limit", func(t *testing.T) {
		// A hostile gateway: the test listens on the client host, and a
		// second tether-edge with edge-1's identity dials it.
		fake := startFakeGateway(t, w)
		const admin = "127.0.0.1:10368"
		args := w.EdgeArgs(e1)
		for i := range args {
			if args[i] == "--gateway" {
				args[i+1] = fake.addr
			}
		}
		cmd := e1.Host.Start(t, w.Bins.Edge, append(args, "--admin-listen", admin, "--max-streams", "2")...)
		conn := fake.next(t)
		kubelet := netip.MustParseAddrPort(e1.Kubelet.Addr)

		for name, head := range map[string][]byte{
			"length over 512": {tunnel.Version, 1, 0xff, 0xff},
			"version 9":       {9, 1, 0, 8},
		} {
			s, err := conn.OpenStreamSync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			s.Write(head)
			s.SetReadDeadline(time.Now().Add(10 * time.Second))
			if rep, err := tunnel.ReadReply(s); rep.Code != tunnel.BadRequest {
				t.Errorf("%s: reply %+v, %v; want bad_request", name, rep, err)
			}
			s.CancelRead(0)
		}
		m, err := world.Get(ctx, e1.Host, "http://"+admin+"/metrics")
		if err != nil {
			t.Fatal(err)
		}
		if v := world.Metric(m, `tether_edge_tunnel_streams_total{result="bad_request"}`); v != 2 {
			t.Errorf("bad_request streams = %v, want 2", v)
		}

		// --max-streams 2: two connections to the kubelet held, the third
		// refused as overloaded.
		var held []*quic.Stream
		for i := range 3 {
			s, err := conn.OpenStreamSync(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := tunnel.WriteRequest(s, tunnel.Request{Dest: kubelet, Client: "192.0.2.1:1"}); err != nil {
				t.Fatal(err)
			}
			s.SetReadDeadline(time.Now().Add(10 * time.Second))
			rep, err := tunnel.ReadReply(s)
			switch {
			case i < 2 && rep.Code != tunnel.OK:
				t.Fatalf("stream %d: %+v, %v; want ok", i, rep, err)
			case i == 2 && rep.Code != tunnel.Overloaded:
				t.Fatalf("stream %d: %+v, %v; want overloaded", i, rep, err)
			}
			held = append(held, s)
		}
		if m, err = world.Get(ctx, e1.Host, "http://"+admin+"/metrics"); err != nil {
			t.Fatal(err)
		}
		if v := world.Metric(m, `tether_edge_tunnel_streams_total{result="overloaded"}`); v != 1 {
			t.Errorf("overloaded streams = %v, want 1", v)
		}
		for _, s := range held {
			s.CancelRead(0)
			s.CancelWrite(0)
		}
		// The edge grants the QUIC stream credit of its limit
		// (tunnel.QUICConfig: 1024 streams) and no more: a gateway cannot
		// make it hold more streams than that.
		opened := 0
		for ; opened < 2000; opened++ {
			if _, err := conn.OpenStream(); err != nil {
				var limit *quic.StreamLimitReachedError
				if !errors.As(err, &limit) {
					t.Fatalf("open stream %d: %v", opened, err)
				}
				break
			}
		}
		if opened > 1024 {
			t.Errorf("opened %d streams at once to the edge, want at most 1024", opened)
		}
		log := e1.Host.Log(cmd)
		wantLog(t, log, "stream refused", "code=bad_request")
		wantLog(t, log, "stream refused", "code=overloaded")
		e1.Host.Stop(cmd)
		undisturbed(t)
	})
}

// connectedSince is when node's current tunnel to gw came up.
func connectedSince(t *testing.T, gw *testenv.Host, node string) time.Time {
	t.Helper()
	for _, e := range gatewayStatus(t, gw).Edges {
		if e.Node == node {
			return e.ConnectedSince
		}
	}
	t.Fatalf("%s has no tunnel to %s", node, gw.Label)
	return time.Time{}
}

// writeFile replaces a file's content in place, as a rotation script
// would.
func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// dialTunnel dials gw's tunnel listener from h as an edge would, with
// cert, trusting roots for the gateway.
func dialTunnel(ctx context.Context, h, gw *testenv.Host, cert tls.Certificate, roots *x509.CertPool) (*quic.Conn, error) {
	pc, err := h.ListenPacket("udp", ":0")
	if err != nil {
		return nil, err
	}
	conf := tunnel.ClientTLS(func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }, roots, gw.Label)
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := quic.Dial(dctx, pc, &net.UDPAddr{IP: gw.Addr.AsSlice(), Port: world.TunnelPort}, conf, tunnel.QUICConfig(tunnel.Limits{}))
	if err != nil {
		pc.Close()
		return nil, err
	}
	context.AfterFunc(conn.Context(), func() { pc.Close() })
	return conn, nil
}

// refusedInHandshake reports whether a dial ended with the gateway's TLS
// alert, during the handshake or (TLS 1.3: the client may finish first)
// right after it.
func refusedInHandshake(conn *quic.Conn, err error) bool {
	if err == nil {
		select {
		case <-conn.Context().Done():
			err = context.Cause(conn.Context())
		case <-time.After(5 * time.Second):
			conn.CloseWithError(tunnel.CloseNormal, "")
			return false
		}
	}
	var te *quic.TransportError
	return errors.As(err, &te) && te.Remote && te.ErrorCode.IsCryptoError()
}

func gatewayMetric(t *testing.T, gw *testenv.Host, series string) float64 {
	t.Helper()
	m, err := world.Get(context.Background(), gw, world.GatewayAdmin(gw, "/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	return world.Metric(m, series)
}

func edgeMetric(t *testing.T, h *testenv.Host, series string) float64 {
	t.Helper()
	m, err := world.Get(context.Background(), h, world.EdgeAdmin("/metrics"))
	if err != nil {
		t.Fatal(err)
	}
	return world.Metric(m, series)
}

// waitForMetric waits until gw's series reaches want.
func waitForMetric(t *testing.T, gw *testenv.Host, series string, want float64) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("%s = %v", series, want), func() bool { return gatewayMetric(t, gw, series) == want })
}

// wantLog checks that one line of log holds every one of parts.
func wantLog(t *testing.T, log string, parts ...string) {
	t.Helper()
lines:
	for _, line := range strings.Split(log, "\n") {
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue lines
			}
		}
		return
	}
	t.Errorf("no log line with %q", parts)
}

// openDownload starts a GET of n pattern bytes from e's kubelet through
// the tunnel and returns the body, to be read as the test goes.
func openDownload(t *testing.T, ctx context.Context, w *world.World, e *world.Edge, n int64) io.Reader {
	t.Helper()
	c := kubeletClient(t, w)
	c.Timeout = 0 // the context bounds it
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.KubeletURL(fmt.Sprintf("/bytes?n=%d", n)), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Close = true // the connection ends with the response
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp.Body
}

// holdConnections opens k connections to e's kubelet through the tunnel
// and keeps them open (the responses unread) until the returned function
// is called.
func holdConnections(t *testing.T, w *world.World, e *world.Edge, k int) (release func()) {
	t.Helper()
	c := kubeletClient(t, w)
	c.Timeout = 0
	var bodies []io.Closer
	for i := range k {
		resp, err := c.Get(e.KubeletURL("/bytes?n=1073741824"))
		if err != nil {
			t.Fatalf("held connection %d: %v", i, err)
		}
		bodies = append(bodies, resp.Body)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			for _, b := range bodies {
				b.Close()
			}
		})
	}
	t.Cleanup(release)
	return release
}

// slowClient dials addr from h and sends data one byte a second. It
// returns "" if the connection was cut (reset or closed) before all of
// data was sent and within 20 s, else what went wrong.
func slowClient(ctx context.Context, h *testenv.Host, addr string, data []byte) string {
	c, err := h.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Sprintf("slow client: %v", err)
	}
	defer c.Close()
	var sent atomic.Int64
	go func() {
		for _, b := range data {
			if _, err := c.Write([]byte{b}); err != nil {
				return
			}
			sent.Add(1)
			time.Sleep(time.Second)
		}
	}()
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 1)
	n, err := c.Read(buf)
	var ne net.Error
	switch {
	case n > 0:
		return fmt.Sprintf("slow client got an answer after %d bytes", sent.Load())
	case errors.As(err, &ne) && ne.Timeout():
		return fmt.Sprintf("slow client not cut within 20 s (%d bytes sent)", sent.Load())
	case sent.Load() >= int64(len(data)):
		return "slow client sent everything before it was cut"
	}
	return ""
}

// dig queries gw's DNS server from h.
func dig(t *testing.T, h, gw *testenv.Host, args ...string) string {
	t.Helper()
	out, err := h.Command(context.Background(), "dig", append([]string{"@" + gw.Addr.String(), "+time=2", "+tries=1"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("dig %v: %v: %s", args, err, out)
	}
	return string(out)
}

// fakeGateway is a hostile gateway: a QUIC listener with a serving
// certificate the edges trust, on the cloud client host.
type fakeGateway struct {
	addr  string
	conns chan *quic.Conn
}

func startFakeGateway(t *testing.T, w *world.World) *fakeGateway {
	t.Helper()
	kp, err := w.GatewayCA.ServerCert("fake-gateway", w.Client.Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	pc, err := w.Client.ListenPacket("udp", ":10362")
	if err != nil {
		t.Fatal(err)
	}
	conf := tunnel.ServerTLS(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &kp.TLS, nil }, w.ClusterCA.Pool())
	ln, err := quic.Listen(pc, conf, tunnel.QUICConfig(tunnel.Limits{}))
	if err != nil {
		pc.Close()
		t.Fatal(err)
	}
	f := &fakeGateway{addr: netip.AddrPortFrom(w.Client.Addr, 10362).String(), conns: make(chan *quic.Conn, 4)}
	go func() {
		for {
			c, err := ln.Accept(context.Background())
			if err != nil {
				return
			}
			f.conns <- c
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		pc.Close()
	})
	return f
}

func (f *fakeGateway) next(t *testing.T) *quic.Conn {
	t.Helper()
	select {
	case c := <-f.conns:
		t.Cleanup(func() { c.CloseWithError(tunnel.CloseShutdown, "") })
		return c
	case <-time.After(15 * time.Second):
		t.Fatal("the edge did not connect to the fake gateway")
		return nil
	}
}
