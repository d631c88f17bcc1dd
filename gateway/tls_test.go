package gateway

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/gateway/internal/edgetest"
	"github.com/tether-edge/tether/gateway/registry"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// TestCertificateFilesReload: --tls-cert/--tls-key and --client-ca are
// rotated on disk while a tunnel and a stream are up. The stream goes on,
// the tunnel stays, and the next handshakes use the new files; a rotation
// half written changes nothing.
func TestCertificateFilesReload(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	dir := t.TempDir()
	edgeCA, servingCA := testenv.MustCA(t, "cluster CA"), testenv.MustCA(t, "gateway CA")
	caFile, err := edgeCA.WriteFile(dir, "client-ca")
	if err != nil {
		t.Fatal(err)
	}
	serving := func(cn string) *testenv.KeyPair {
		kp, err := servingCA.ServerCert(cn, "gateway")
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	old := serving("gateway-old")
	certFile, keyFile, err := old.WriteFiles(dir, "serving")
	if err != nil {
		t.Fatal(err)
	}

	g, stop := startTLSGateway(t, cp, func(c *Config) { c.ClientCA, c.TLSCert, c.TLSKey = caFile, certFile, keyFile })
	t.Cleanup(stop)
	admin := "http://" + g.AdminAddr().String()
	dial := func(ca *testenv.CA, node string) (*edgetest.Edge, *x509.Certificate) {
		t.Helper()
		return dialEdge(t, g, ca, node, servingCA.Pool())
	}
	edge1, seen := dial(edgeCA, "edge-1")
	if seen.Subject.CommonName != "gateway-old" {
		t.Fatalf("edge-1 saw %s", seen.Subject)
	}
	s := openEcho(t, g, "edge-1")
	s.roundTrip("before the rotation")

	// Half a rotation: the new certificate with the old key. Nothing
	// changes for new edges.
	next := serving("gateway-new")
	rewrite(t, certFile, next.CertPEM)
	if _, seen := dial(edgeCA, "edge-2"); seen.Subject.CommonName != "gateway-old" {
		t.Fatalf("with the key not yet written, a new edge saw %s", seen.Subject)
	}
	rewrite(t, keyFile, next.KeyPEM)
	if _, seen := dial(edgeCA, "edge-3"); seen.Subject.CommonName != "gateway-new" {
		t.Fatalf("after the rotation a new edge saw %s", seen.Subject)
	}
	s.roundTrip("after the serving certificate's rotation")
	want := fmt.Sprintf(`tether_gateway_certificate_expiry_timestamp_seconds{cert="serving"} %g`, float64(next.Cert.NotAfter.Unix()))
	if m := httpGet(t, admin+"/metrics"); !strings.Contains(m, want) {
		t.Errorf("/metrics lacks %s", want)
	}

	// A new cluster CA joins --client-ca: its edges are accepted, the
	// others stay.
	newCA := testenv.MustCA(t, "new cluster CA")
	rewrite(t, caFile, append(append([]byte{}, edgeCA.CertPEM...), newCA.CertPEM...))
	dial(newCA, "edge-4")
	s.roundTrip("after the client CA's rotation")
	if _, closed := edge1.CloseCode(); closed {
		t.Fatal("edge-1's tunnel was closed by the rotations")
	}
	s.close()
	if resp, err := http.Get(admin + "/ca.crt"); err != nil || resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /ca.crt with --tls-cert: %v, %v; want 404", resp, err)
	}
}

// TestSelfManagedTLS: without --tls-cert/--tls-key the gateway's own CA in
// --data-dir issues its serving certificate; /ca.crt gives edges the CA,
// which stays the same across restarts.
func TestSelfManagedTLS(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	dir := t.TempDir()
	edgeCA := testenv.MustCA(t, "cluster CA")
	caFile, err := edgeCA.WriteFile(dir, "client-ca")
	if err != nil {
		t.Fatal(err)
	}
	dataDir := filepath.Join(dir, "data")
	selfManaged := func(c *Config) {
		c.ClientCA, c.TLSCert, c.TLSKey = caFile, "", ""
		c.DataDir, c.ServerNames = dataDir, []string{"gateway", "127.0.0.1"}
	}

	var caPEM []byte
	for i, node := range []string{"edge-1", "edge-2"} {
		g, stop := startTLSGateway(t, cp, selfManaged)
		admin := "http://" + g.AdminAddr().String()
		pem := httpGet(t, admin+"/ca.crt")
		if i == 0 {
			caPEM = []byte(pem)
		} else if pem != string(caPEM) {
			t.Fatal("the CA changed across a restart")
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(caPEM) {
			t.Fatalf("/ca.crt: %q", pem)
		}
		_, seen := dialEdge(t, g, edgeCA, node, roots)
		if err := seen.VerifyHostname("127.0.0.1"); err != nil {
			t.Errorf("serving certificate: %v", err)
		}
		if m := httpGet(t, admin+"/metrics"); !strings.Contains(m, `tether_gateway_certificate_expiry_timestamp_seconds{cert="serving"}`) {
			t.Error("/metrics lacks the serving certificate's expiry")
		}
		stop()
	}
}

// startTLSGateway runs a gateway with its listeners on loopback, without
// DNS or DNAT, edited by edit; stop ends it.
func startTLSGateway(t *testing.T, cp *testenv.ControlPlane, edit func(*Config)) (_ *Gateway, stop func()) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Kubeconfig = cp.AdminKubeconfig
	cfg.TunnelListen, cfg.ProxyPort, cfg.AdminListen = "127.0.0.1:0", 0, "127.0.0.1:0"
	cfg.DNSListen, cfg.NetRules = "", "none"
	cfg.ShutdownGrace = metav1.Duration{Duration: time.Second}
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	edit(&cfg)
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	var once sync.Once
	return g, func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
}

// dialEdge connects a test edge for node with a certificate of ca, trusting
// roots for the gateway's name "gateway", waits until it is registered,
// and returns it with the serving certificate it saw.
func dialEdge(t *testing.T, g *Gateway, ca *testenv.CA, node string, roots *x509.CertPool) (*edgetest.Edge, *x509.Certificate) {
	t.Helper()
	kp, err := ca.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := edgetest.Dial(ctx, g.TunnelAddr().String(), edgetest.Options{Cert: kp.TLS, Roots: roots, ServerName: "gateway"})
	if err != nil {
		t.Fatalf("edge %s: %v", node, err)
	}
	t.Cleanup(e.Close)
	testenv.Eventually(t, node+" registered", func() bool { _, ok := g.registry.Lookup(node); return ok })
	return e, e.Conn().ConnectionState().TLS.PeerCertificates[0]
}

// rewrite replaces a file's content in place, as a rotation script would.
func rewrite(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	// A time of its own, so that the change shows even if it falls in the
	// same clock tick as the previous write.
	mt := time.Now().Add(time.Duration(len(data)) * time.Millisecond)
	os.Chtimes(path, mt, mt)
}

// echoStream is a stream through a gateway's tunnel to an echo server
// that the test edge dialled.
type echoStream struct {
	t *testing.T
	s *registry.Stream
}

// openEcho starts an echo server on loopback and opens a stream to it
// through node's tunnel.
func openEcho(t *testing.T, g *Gateway, node string) *echoStream {
	t.Helper()
	echo := testenv.EchoServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := g.registry.Open(ctx, node)
	if err != nil {
		t.Fatal(err)
	}
	if err := tunnel.WriteRequest(s, tunnel.Request{Dest: echo}); err != nil {
		t.Fatal(err)
	}
	if _, err := tunnel.ReadReply(s); err != nil {
		t.Fatal(err)
	}
	return &echoStream{t: t, s: s}
}

func (e *echoStream) roundTrip(msg string) {
	e.t.Helper()
	if _, err := io.WriteString(e.s, msg); err != nil {
		e.t.Fatalf("stream write %s: %v", msg, err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(e.s, buf); err != nil || string(buf) != msg {
		e.t.Fatalf("stream echo %s: %q, %v", msg, buf, err)
	}
}

func (e *echoStream) close() {
	e.s.Close()
	e.s.Release()
}
