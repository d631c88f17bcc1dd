package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/gateway/internal/edgetest"
	"github.com/tether-edge/tether/gateway/internal/metrictest"
	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/gateway/registry"
	"github.com/tether-edge/tether/gateway/sources"
	"github.com/tether-edge/tether/gateway/tunnelserver"
	"github.com/tether-edge/tether/internal/accept/accepttest"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// The end-to-end tests run on loopback without netrules: edge-1's
// "InternalIP" is 127.0.0.2, where its stand-in kubelet listens, and the
// test edge dials it. Clients connect to the proxy's listener on 127.0.0.1,
// so they are routed by name unless a test fakes the original destination.

const (
	edge1Addr = "127.0.0.2"
	zone      = "tether.internal"
)

type env struct {
	t          *testing.T
	ca         *testenv.CA
	reg        *registry.Registry
	tunnelAddr string
	snap       *nodewatch.Snapshot
}

func newEnv(t *testing.T) *env {
	t.Helper()
	ca := testenv.MustCA(t, "tether test CA")
	kp, err := ca.ServerCert("gateway", "gateway")
	if err != nil {
		t.Fatal(err)
	}
	reg := registry.New(registry.Options{})
	srv, err := tunnelserver.Listen("127.0.0.1:0", reg, tunnelserver.Options{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &kp.TLS, nil },
		ClientCAs:      ca.Pool(),
		ShutdownGrace:  time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("tunnel server: %v", err)
		}
	})
	snap := &nodewatch.Snapshot{Version: 1, Nodes: map[string]nodewatch.Node{
		"edge-1": {Name: "edge-1", Edge: true, InternalIPs: addrs(edge1Addr), VIP: netip.MustParseAddr("100.64.0.1")},
		"edge-2": {Name: "edge-2", Edge: true, InternalIPs: addrs("127.0.0.3")},
	}}
	return &env{t: t, ca: ca, reg: reg, tunnelAddr: srv.Addr().String(), snap: snap}
}

// edge connects a test edge for node and waits until it is registered.
func (e *env) edge(node string, allow func(tunnel.Request) tunnel.Code) *edgetest.Edge {
	e.t.Helper()
	kp, err := e.ca.NodeCert(node)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	edge, err := edgetest.Dial(ctx, e.tunnelAddr, edgetest.Options{
		Cert: kp.TLS, Roots: e.ca.Pool(), ServerName: "gateway", Allow: allow,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(edge.Close)
	testenv.Eventually(e.t, node+" registered", func() bool { _, ok := e.reg.Lookup(node); return ok })
	return edge
}

// proxy starts a proxy with opts on 127.0.0.1 and returns it and its
// address.
func (e *env) proxy(opts Options) (*Proxy, string) {
	e.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	return e.proxyOn(ln, opts)
}

// proxyOn starts a proxy with opts on ln.
func (e *env) proxyOn(ln net.Listener, opts Options) (*Proxy, string) {
	e.t.Helper()
	if opts.Zones == nil {
		opts.Zones = []string{zone}
	}
	p, err := New(e.reg, opts)
	if err != nil {
		e.t.Fatal(err)
	}
	p.Update(e.snap)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Serve(ctx, ln) }()
	e.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("proxy: %v", err)
		}
	})
	return p, ln.Addr().String()
}

// backend starts a stand-in for edge-1's kubelet on 127.0.0.2: HTTPS with
// its own certificate when tlsName is set, plain HTTP otherwise. /healthz
// answers ok; /sha256 answers the hash of the request body.
func (e *env) backend(tlsName string) (port uint16) {
	e.t.Helper()
	ln, err := net.Listen("tcp", edge1Addr+":0")
	if err != nil {
		e.t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "ok from %s", r.Host)
	})
	mux.HandleFunc("/sha256", func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		io.Copy(h, r.Body)
		io.WriteString(w, hex.EncodeToString(h.Sum(nil)))
	})
	ts := httptest.NewUnstartedServer(mux)
	ts.Listener.Close()
	ts.Listener = ln
	if tlsName != "" {
		kp, err := e.ca.ServerCert(tlsName, tlsName)
		if err != nil {
			e.t.Fatal(err)
		}
		ts.TLS = &tls.Config{Certificates: []tls.Certificate{kp.TLS}}
		ts.StartTLS()
	} else {
		ts.Start()
	}
	e.t.Cleanup(ts.Close)
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// client returns an HTTP client whose every connection goes to proxyAddr,
// whatever the URL says, and that verifies servers against the test CA.
func (e *env) client(proxyAddr string) *http.Client {
	var d net.Dialer
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return d.DialContext(ctx, "tcp", proxyAddr)
			},
			TLSClientConfig:   &tls.Config{RootCAs: e.ca.Pool()},
			DisableKeepAlives: true,
		},
	}
}

func get(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s %q %v", url, resp.Status, body, err)
	}
	return string(body)
}

func value(t *testing.T, p *Proxy, name string, labels ...string) float64 {
	t.Helper()
	var v float64
	var err error
	switch name {
	case "refusals":
		v, err = metrictest.Value(p.metrics.refusals, "tether_gateway_proxy_refusals_total", labels...)
	case "connections":
		v, err = metrictest.Value(p.metrics.connections, "tether_gateway_proxy_connections_total", labels...)
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TLS by server name: the client verifies the stand-in kubelet's own
// certificate, so TLS is end to end through the gateway.
func TestProxyRoutesBySNI(t *testing.T) {
	e := newEnv(t)
	port := e.backend("edge-1." + zone)
	edge := e.edge("edge-1", edgetest.AllowPorts(port))
	p, addr := e.proxy(Options{DefaultPort: port})

	body := get(t, e.client(addr), "https://edge-1."+zone+"/healthz")
	if !strings.HasPrefix(body, "ok from edge-1."+zone) {
		t.Fatalf("body %q", body)
	}
	reqs := edge.Requests()
	if len(reqs) != 1 || reqs[0].Dest != netip.AddrPortFrom(netip.MustParseAddr(edge1Addr), port) ||
		!strings.HasPrefix(reqs[0].Client, "127.0.0.1:") {
		t.Fatalf("edge got requests %+v, want one for %s:%d from the client", reqs, edge1Addr, port)
	}
	// The client may close with the server's close_notify still unread,
	// which resets the connection: a relay that ends with an error is as
	// good as a clean one here; the request went through.
	testenv.Eventually(t, "the connection is counted as done", func() bool {
		return value(t, p, "connections", "result=relayed")+value(t, p, "connections", "result="+resultRelayError) == 1
	})
	ed, _ := e.reg.Lookup("edge-1")
	if st := ed.Status(); st.BytesUp == 0 || st.BytesDown == 0 || st.Streams != 0 {
		t.Fatalf("edge status after the request: %+v", st)
	}
}

// Plain HTTP by Host; a large body arrives intact behind the sniffed head.
func TestProxyRoutesByHost(t *testing.T) {
	e := newEnv(t)
	port := e.backend("")
	e.edge("edge-1", edgetest.AllowPorts(port))
	_, addr := e.proxy(Options{DefaultPort: port})
	c := e.client(addr)

	if body := get(t, c, "http://edge-1/healthz"); body != "ok from edge-1" {
		t.Fatalf("body %q", body)
	}
	data := make([]byte, 8<<20)
	rand.Read(data)
	sum := sha256.Sum256(data)
	resp, err := c.Post("http://EDGE-1."+zone+"./sha256", "application/octet-stream", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	if string(got) != hex.EncodeToString(sum[:]) {
		t.Fatalf("backend hashed %q, want %x", got, sum)
	}
}

// Accept failing as it does out of file descriptors does not end Serve:
// each failure is counted under tether_gateway_accept_errors_total, and
// the client that connected meanwhile is relayed once Accept works again.
func TestProxyAcceptErrors(t *testing.T) {
	e := newEnv(t)
	port := e.backend("")
	e.edge("edge-1", edgetest.AllowPorts(port))
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := accepttest.New(inner, true)
	reg := prometheus.NewRegistry()
	_, addr := e.proxyOn(fl, Options{DefaultPort: port, Registerer: reg})

	body := make(chan string, 1)
	go func() {
		resp, err := e.client(addr).Get("http://edge-1/healthz")
		if err != nil {
			body <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body <- string(b)
	}()
	testenv.Eventually(t, "Accept failed three times", func() bool { return fl.Failures() >= 3 })
	fl.SetFailing(false)
	if got := <-body; got != "ok from edge-1" {
		t.Fatalf("GET through the proxy: %q", got)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var counted float64
	for _, mf := range mfs {
		if mf.GetName() == "tether_gateway_accept_errors_total" {
			counted = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if counted < 3 || counted != float64(fl.Failures()) {
		t.Errorf("tether_gateway_accept_errors_total{listener=\"proxy\"} = %v, want the %d failures", counted, fl.Failures())
	}
}

// A connection DNATed to an edge address is routed by that address; in vip
// mode the edge dials the node's InternalIP.
func TestProxyRoutesByOriginalDestination(t *testing.T) {
	e := newEnv(t)
	port := e.backend("")
	edge := e.edge("edge-1", edgetest.AllowPorts(port))
	for _, tc := range []struct {
		mode nodewatch.Mode
		dst  string
	}{
		{nodewatch.ModeNodeIP, edge1Addr},
		{nodewatch.ModeVIP, "100.64.0.1"},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			dst := netip.AddrPortFrom(netip.MustParseAddr(tc.dst), port)
			_, addr := e.proxy(Options{Mode: tc.mode, OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) { return dst, nil }})
			// No name anywhere: the Host is an unrelated one.
			if body := get(t, e.client(addr), "http://unrelated.example/healthz"); body != "ok from unrelated.example" {
				t.Fatalf("body %q", body)
			}
			reqs := edge.Requests()
			if last := reqs[len(reqs)-1]; last.Dest != netip.AddrPortFrom(netip.MustParseAddr(edge1Addr), port) {
				t.Fatalf("edge asked to dial %v", last.Dest)
			}
		})
	}
}

// TestProxyRoutesPodAddress: a connection to an address in an edge's pod
// range reaches that edge, which is asked to dial the pod address itself
// on the original port; an address in no routed range is refused.
func TestProxyRoutesPodAddress(t *testing.T) {
	e := newEnv(t)
	ln, err := net.Listen("tcp", "127.0.9.5:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "pod") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	podAddr := ln.Addr().(*net.TCPAddr).AddrPort()
	n := e.snap.Nodes["edge-1"]
	n.PodCIDRs = prefixes("127.0.9.0/24")
	e.snap.Nodes["edge-1"] = n
	e.snap.Pods = nodewatch.ResolvePods(e.snap.Nodes, nodewatch.PodPolicy{Ranges: prefixes("127.0.0.0/8")}, nil, nil)
	edge := e.edge("edge-1", edgetest.AllowPorts(podAddr.Port()))

	var dst atomic.Value
	dst.Store(podAddr)
	_, addr := e.proxy(Options{Mode: nodewatch.ModeNodeIP, OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) {
		return dst.Load().(netip.AddrPort), nil
	}})
	if body := get(t, e.client(addr), "http://unrelated.example/"); body != "pod" {
		t.Fatalf("body %q", body)
	}
	reqs := edge.Requests()
	if last := reqs[len(reqs)-1]; last.Dest != podAddr {
		t.Fatalf("edge asked to dial %v, want the pod address %v", last.Dest, podAddr)
	}
	// Outside every routed range, with no name to route by: reset.
	dst.Store(netip.AddrPortFrom(netip.MustParseAddr("127.0.10.5"), podAddr.Port()))
	expectReset(t, addr, "GET / HTTP/1.1\r\nHost: unrelated.example\r\n\r\n")
	if got := len(edge.Requests()); got != len(reqs) {
		t.Errorf("the edge got %d more requests for an address in no range", got-len(reqs))
	}
}

// expectReset sends a request head (if any) and checks that the proxy
// resets the connection.
func expectReset(t *testing.T, addr, head string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if head != "" {
		io.WriteString(c, head)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = bufio.NewReader(c).ReadByte()
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("read after %q: %v, want connection reset", head, err)
	}
}

func TestProxyRefusals(t *testing.T) {
	e := newEnv(t)
	port := e.backend("")
	e.edge("edge-1", edgetest.AllowPorts(port))

	// The edge refuses a port outside its allow list; the refusal reason
	// is counted on the proxy and on the edge.
	p, addr := e.proxy(Options{DefaultPort: 10255, PeekTimeout: 100 * time.Millisecond})
	expectReset(t, addr, "GET / HTTP/1.1\r\nHost: edge-1\r\n\r\n")
	if v := value(t, p, "refusals", "reason=not_allowed"); v != 1 {
		t.Errorf("not_allowed refusals: %v, want 1", v)
	}
	ed, _ := e.reg.Lookup("edge-1")
	// The client sees the reset before the proxy has released the stream.
	testenv.Eventually(t, "the refused stream is released", func() bool { return ed.Status().Streams == 0 })
	if st := ed.Status(); st.Refusals["not_allowed"] != 1 {
		t.Errorf("edge-1 status %+v, want one not_allowed refusal", st)
	}

	for _, tc := range []struct{ head, reason string }{
		{"GET / HTTP/1.1\r\nHost: edge-2\r\n\r\n", registry.ReasonNoTunnel}, // known node, no tunnel
		{"GET / HTTP/1.1\r\nHost: nowhere.example\r\n\r\n", ReasonNoRoute},
		{"\x00garbage\r\n\r\n", ReasonNoRoute},
		{"", ReasonPeekTimeout}, // a client that says nothing
		{"GET / HTTP/1.1\r\nHost: edge-1\r\n", ReasonPeekTimeout},
	} {
		before := value(t, p, "refusals", "reason="+tc.reason)
		expectReset(t, addr, tc.head)
		if v := value(t, p, "refusals", "reason="+tc.reason); v != before+1 {
			t.Errorf("after %q: %s refusals %v, want %v", tc.head, tc.reason, v, before+1)
		}
	}
	if v := value(t, p, "connections", "result=refused"); v != 6 {
		t.Errorf("refused connections: %v, want 6", v)
	}
}

// The client's first bytes go to the edge right behind the request, before
// the edge has replied: an edge that reads them before it answers still
// gets them, and the relay carries on after its OK.
func TestProxySendsClientBytesBeforeReply(t *testing.T) {
	e := newEnv(t)
	kp, err := e.ca.NodeCert("edge-1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tc := tunnel.ClientTLS(func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &kp.TLS, nil }, e.ca.Pool(), "gateway")
	conn, err := quic.DialAddr(ctx, e.tunnelAddr, tc, tunnel.QUICConfig(tunnel.Limits{}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseWithError(tunnel.CloseNormal, "")
	edgeErr := make(chan error, 1)
	go func() {
		s, err := conn.AcceptStream(ctx)
		if err != nil {
			edgeErr <- err
			return
		}
		if _, err := tunnel.ReadRequest(s); err != nil {
			edgeErr <- err
			return
		}
		first := make([]byte, len("hello"))
		if _, err := io.ReadFull(s, first); err != nil {
			edgeErr <- fmt.Errorf("read the client's bytes before replying: %w", err)
			return
		}
		tunnel.WriteReply(s, tunnel.Reply{Code: tunnel.OK})
		s.Write(append([]byte("echo "), first...))
		s.Close()
		edgeErr <- nil
	}()
	testenv.Eventually(t, "edge-1 is registered", func() bool { _, ok := e.reg.Lookup("edge-1"); return ok })

	dst := netip.AddrPortFrom(netip.MustParseAddr(edge1Addr), 10250)
	_, addr := e.proxy(Options{ReplyTimeout: 5 * time.Second, OriginalDst: func(*net.TCPConn) (netip.AddrPort, error) { return dst, nil }})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "hello")
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "echo hello" {
		t.Fatalf("client read %q, %v; want %q", got, err, "echo hello")
	}
	if err := <-edgeErr; err != nil {
		t.Fatal(err)
	}
}

// A client the source filter refuses is reset before the proxy reads a
// byte or opens a stream: the edge sees no request, and the refusal is
// counted as source.
func TestProxyRefusesSource(t *testing.T) {
	e := newEnv(t)
	port := e.backend("")
	edge := e.edge("edge-1", edgetest.AllowPorts(port))
	f, err := sources.New(sources.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}})
	if err != nil {
		t.Fatal(err)
	}
	p, addr := e.proxy(Options{DefaultPort: port, Sources: f})
	// The reset may come so soon that it fails the dial itself.
	if c, err := net.Dial("tcp", addr); err == nil {
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: edge-1\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := bufio.NewReader(c).ReadByte(); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("read from a refused client's connection: %v, want connection reset", err)
		}
		c.Close()
	} else if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatal(err)
	}
	if v := value(t, p, "refusals", "reason="+ReasonSource); v != 1 {
		t.Errorf("source refusals: %v, want 1", v)
	}
	if reqs := edge.Requests(); len(reqs) != 0 {
		t.Errorf("the edge got requests %+v from a refused client", reqs)
	}
}
