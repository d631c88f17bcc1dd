package edgeproxy

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	certificatesv1 "k8s.io/api/certificates/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/edgeproxy/identity"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

func TestValidateBootstrap(t *testing.T) {
	ok := DefaultConfig()
	ok.Gateway = []string{"gw.example:10262"}
	ok.BootstrapKubeconfig = "/etc/tether/bootstrap-kubeconfig"
	ok.NodeName = "edge-1"
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	if !ok.proxyConfigured() {
		t.Error("--bootstrap-kubeconfig does not enable the apiserver proxy")
	}
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"with cert", func(c *Config) { c.Cert = "/k.pem" }, "--bootstrap-kubeconfig and --cert/--key are mutually exclusive"},
		{"with key", func(c *Config) { c.Key = "/k.pem" }, "--bootstrap-kubeconfig and --cert/--key are mutually exclusive"},
		{"with kubeconfig", func(c *Config) { c.Kubeconfig = "/kc" }, "--bootstrap-kubeconfig and --kubeconfig are mutually exclusive"},
		{"no node name", func(c *Config) { c.NodeName = "" }, "--bootstrap-kubeconfig needs --node-name"},
		{"no data dir", func(c *Config) { c.DataDir = "" }, "--data-dir is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.change(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestBootstrapCertificate runs tether-edge with --bootstrap-kubeconfig
// against a real kube-apiserver and kube-controller-manager (csrapproving
// and csrsigning with the apiserver's client CA), with the RBAC a kubeadm
// cluster has for kubelet TLS bootstrapping and a bootstrap token.
func TestBootstrapCertificate(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{
		ExtraAPIServerArgs: []string{"--enable-bootstrap-token-auth=true"},
	})
	// Certificates of 30 s: the signer backdates them 5 minutes, so each is
	// past its rotation point (70-90 % of its life) when issued, and the
	// edge renews it continuously, every second or two.
	const life = 30 * time.Second
	cp.StartControllerManager(t, testenv.ControllerManagerOptions{
		Controllers:            []string{testenv.CSRApprovingController, testenv.CSRSigningController},
		SignWithCA:             true,
		ClusterSigningDuration: life,
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The bindings the package ships for clusters that lack kubeadm's.
	if err := testenv.ApplyManifests(ctx, cp.Admin, false, "../packaging/kubernetes/edge-bootstrap-rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	kubeconfig := bootstrapKubeconfig(ctx, t, cp, "abcdef", "0123456789abcdef")

	t.Run("ObtainsAndRotates", func(t *testing.T) {
		const node = "edge-boot"
		createNode(ctx, t, cp.Client, node)
		gw := startTestGateway(t, cp.CA)
		echo := testenv.EchoServer(t)
		e := startBootstrapEdge(t, kubeconfig, node, gw, echo)

		// The first tunnel connection presents the certificate the CSR API
		// issued: the node's identity, from the cluster CA, kept in
		// --data-dir.
		conn1 := gw.accept(ctx, t)
		first := peerCert(t, conn1)
		checkNodeCert(t, first, node, cp.CA.Pool())
		checkStored(t, e.dataDir, first)
		csrs := nodeCSRs(ctx, t, cp.Client, node)
		if len(csrs) == 0 || csrs[0].Spec.Username != "system:bootstrap:abcdef" ||
			csrs[0].Spec.SignerName != certificatesv1.KubeAPIServerClientKubeletSignerName || !autoApproved(csrs[0]) {
			t.Fatalf("first CSR: want one from system:bootstrap:abcdef for %s, auto-approved: %+v", identity.ClientSignerName, csrs)
		}

		// The apiserver takes it as the node: the proxy writes the node's
		// Lease, which only system:node:edge-boot may.
		kubelet := e.client(t)
		renewLease(ctx, t, kubelet, cp.Client, node)

		// A relayed connection and a watch, up before the rotations.
		s := openEcho(ctx, t, conn1, echo)
		roundTrip(t, s, "before rotation")
		w, err := kubelet.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + node})
		if err != nil {
			t.Fatalf("watch through the proxy: %v", err)
		}
		defer w.Stop()

		// Wait until the first certificate has been replaced and has
		// expired, and the apiservers have been probed since: a request
		// over a connection made with it would now be refused (once: then
		// kube-apiserver closes the connection).
		testenv.EventuallyWithin(t, life+20*time.Second, fmt.Sprintf("certificate %s replaced and expired (at %v)", first.SerialNumber, first.NotAfter), func() bool {
			return time.Now().After(first.NotAfter.Add(e.cfg.HealthCheckInterval.Duration+time.Second)) &&
				stored(t, e.dataDir).SerialNumber.Cmp(first.SerialNumber) != 0
		})
		csrs = nodeCSRs(ctx, t, cp.Client, node)
		t.Logf("%d certificates issued in %v", len(csrs), time.Since(first.NotBefore.Add(5*time.Minute)).Round(time.Second))
		if len(csrs) < 2 {
			t.Fatalf("%d CSRs", len(csrs))
		}
		// Renewals are asked with the current certificate, and approved for
		// the node itself (selfnodeclient).
		for _, csr := range csrs[1:] {
			// The newest may have been listed before the approver saw it
			// (renewals come every second here): wait for its decision.
			testenv.EventuallyNoError(t, "a decision on CSR "+csr.Name, func() error {
				if len(csr.Status.Conditions) > 0 {
					return nil
				}
				c, err := cp.Client.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				if csr = *c; len(csr.Status.Conditions) == 0 {
					return errors.New("no condition yet")
				}
				return nil
			})
			if csr.Spec.Username != "system:node:"+node || !autoApproved(csr) {
				t.Errorf("renewal CSR %s from %s, conditions %+v", csr.Name, csr.Spec.Username, csr.Status.Conditions)
			}
		}

		// The stream and the watch opened with the first certificate go on.
		roundTrip(t, s, "after rotation")
		s.Close()
		patch := []byte(`{"metadata":{"labels":{"rotated":"yes"}}}`)
		if _, err := cp.Client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		waitEvent(ctx, t, w, func(ev watch.Event) bool {
			n, ok := ev.Object.(*corev1.Node)
			return ev.Type == watch.Modified && ok && n.Labels["rotated"] == "yes"
		})
		// New requests go over new connections, with a valid certificate.
		renewLease(ctx, t, kubelet, cp.Client, node)
		// With each renewal the edge moved its tunnel to a new connection
		// presenting the new certificate, while conn1 kept the stream it
		// relayed (above). Take one that is up and whose certificate is
		// valid (renewals come every second or two here, and each earlier
		// connection is closed by the edge once it has no stream).
		var conn2 *quic.Conn
		for conn2 == nil {
			c := gw.accept(ctx, t)
			if c.Context().Err() == nil && time.Until(peerCert(t, c).NotAfter) > 5*time.Second {
				conn2 = c
			}
		}
		conn1.CloseWithError(0, "test: done with the first connection")
		second := peerCert(t, conn2)
		checkNodeCert(t, second, node, cp.CA.Pool())
		if second.SerialNumber.Cmp(first.SerialNumber) == 0 {
			t.Errorf("new tunnel connection presents the first certificate again")
		}
		s2 := openEcho(ctx, t, conn2, echo)
		roundTrip(t, s2, "new connection")
		s2.Close()

		// No request was refused: the health checks never failed.
		metrics := e.metrics(t)
		for _, want := range []string{"tether_edge_client_certificate_expiry_timestamp_seconds ", "tether_edge_client_certificate_renew_failures_total 0"} {
			if !strings.Contains(metrics, want) {
				t.Errorf("/metrics lacks %q", want)
			}
		}
		if strings.Contains(metrics, `result="fail"`) {
			t.Errorf("failed apiserver probes:\n%s", metrics)
		}
	})

	t.Run("KeepsAValidCertificate", func(t *testing.T) {
		// A certificate for the node already in --data-dir is used as it
		// is: no CSR, even with a bootstrap token the apiserver refuses.
		const node = "edge-kept"
		createNode(ctx, t, cp.Client, node)
		kp, err := cp.CA.NodeCert(node)
		if err != nil {
			t.Fatal(err)
		}
		gw := startTestGateway(t, cp.CA)
		echo := testenv.EchoServer(t)
		badToken := bootstrapKubeconfig(ctx, t, cp, "", "")
		e := newBootstrapEdge(t, badToken, node, gw, echo)
		if err := os.MkdirAll(filepath.Join(e.dataDir, identity.CertDir), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(identity.CertPath(e.dataDir), append(kp.CertPEM, kp.KeyPEM...), 0o600); err != nil {
			t.Fatal(err)
		}
		e.start(t)
		conn := gw.accept(ctx, t)
		if got := peerCert(t, conn); got.SerialNumber.Cmp(kp.Cert.SerialNumber) != 0 {
			t.Errorf("tunnel presents %s, not the certificate in --data-dir", got.Subject)
		}
		renewLease(ctx, t, e.client(t), cp.Client, node)
		if csrs := nodeCSRs(ctx, t, cp.Client, node); len(csrs) != 0 {
			t.Errorf("%d CSRs for a node whose certificate is valid", len(csrs))
		}
	})
}

// bootstrapKubeconfig creates the bootstrap token id.secret, valid for an
// hour, and writes a kubeconfig with it; an empty id writes one with a
// token the apiserver does not know.
func bootstrapKubeconfig(ctx context.Context, t *testing.T, cp *testenv.ControlPlane, id, secret string) string {
	t.Helper()
	if id == "" {
		id, secret = "zzzzzz", "zzzzzzzzzzzzzzzz"
	} else {
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + id, Namespace: metav1.NamespaceSystem},
			Type:       corev1.SecretTypeBootstrapToken,
			StringData: map[string]string{
				"token-id": id, "token-secret": secret, "usage-bootstrap-authentication": "true",
				"expiration": time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
			},
		}
		if _, err := cp.Client.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: cp.URL, CertificateAuthorityData: cp.CA.CertPEM}
	kc.AuthInfos["bootstrap"] = &clientcmdapi.AuthInfo{Token: id + "." + secret}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "bootstrap"}
	kc.CurrentContext = "c"
	path := filepath.Join(t.TempDir(), "bootstrap-kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func createNode(ctx context.Context, t *testing.T, admin kubernetes.Interface, node string) {
	t.Helper()
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// renewLease creates or renews the node's Lease through c, and checks
// with admin that the apiserver has it (not the proxy's offline
// renewal).
func renewLease(ctx context.Context, t *testing.T, c, admin kubernetes.Interface, node string) {
	t.Helper()
	leases := c.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now().Truncate(time.Microsecond)) // what the apiserver keeps
	l, err := leases.Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		l = &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &now}}
		_, err = leases.Create(ctx, l, metav1.CreateOptions{})
	} else {
		l.Spec.RenewTime = &now
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatalf("renew the Lease of %s through the proxy: %v", node, err)
	}
	got, err := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !got.Spec.RenewTime.Equal(&now) {
		t.Fatalf("the apiserver has the Lease of %s renewed at %v, not %v", node, got.Spec.RenewTime, now)
	}
}

// nodeCSRs are the CSRs for node, oldest first.
func nodeCSRs(ctx context.Context, t *testing.T, admin kubernetes.Interface, node string) []certificatesv1.CertificateSigningRequest {
	t.Helper()
	l, err := admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []certificatesv1.CertificateSigningRequest
	for _, csr := range l.Items {
		if cn := csrCommonName(t, csr.Spec.Request); cn == "system:node:"+node {
			out = append(out, csr)
		}
	}
	// Names are generated; the creation time has a resolution of seconds.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].CreationTimestamp.Before(&out[j-1].CreationTimestamp); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

func csrCommonName(t *testing.T, request []byte) string {
	t.Helper()
	block, _ := pem.Decode(request)
	if block == nil {
		t.Fatal("CSR without PEM")
	}
	cr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cr.Subject.CommonName
}

func autoApproved(csr certificatesv1.CertificateSigningRequest) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateApproved && c.Reason == "AutoApproved" {
			return true
		}
	}
	return false
}

// checkNodeCert checks that cert is node's client certificate from the CA.
func checkNodeCert(t *testing.T, cert *x509.Certificate, node string, roots *x509.CertPool) {
	t.Helper()
	if cert.Subject.CommonName != "system:node:"+node || strings.Join(cert.Subject.Organization, ",") != "system:nodes" {
		t.Errorf("subject %s", cert.Subject)
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("certificate does not verify as a client certificate of the cluster CA: %v", err)
	}
	if k, ok := cert.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve != elliptic.P256() {
		t.Errorf("public key %T, want ECDSA P-256", cert.PublicKey)
	}
}

// checkStored checks the certificate file in dataDir: it is cert, the file
// 0600 in a 0700 directory.
func checkStored(t *testing.T, dataDir string, cert *x509.Certificate) {
	t.Helper()
	if got := stored(t, dataDir); !got.Equal(cert) {
		t.Errorf("%s holds %s, the tunnel presents %s", identity.CertPath(dataDir), got.SerialNumber, cert.SerialNumber)
	}
	for path, want := range map[string]os.FileMode{identity.CertPath(dataDir): 0o600, filepath.Dir(identity.CertPath(dataDir)): 0o700 | os.ModeDir} {
		if st, err := os.Stat(path); err != nil || st.Mode() != want {
			t.Errorf("%s: mode %v (%v), want %v", path, st.Mode(), err, want)
		}
	}
}

func stored(t *testing.T, dataDir string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(identity.CertPath(dataDir))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(b) // the certificate, then the key
	if block == nil || block.Type != "CERTIFICATE" {
		t.Fatalf("%s does not start with a certificate", identity.CertPath(dataDir))
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func waitEvent(ctx context.Context, t *testing.T, w watch.Interface, match func(watch.Event) bool) {
	t.Helper()
	timeout := time.After(15 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch opened before the rotations ended")
			}
			if match(ev) {
				return
			}
		case <-timeout:
			t.Fatal("no event on the watch opened before the rotations")
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
	}
}

// bootstrapEdge is tether-edge run with --bootstrap-kubeconfig.
type bootstrapEdge struct {
	cfg     Config
	dataDir string
}

func newBootstrapEdge(t *testing.T, kubeconfig, node string, gw *testGateway, echo netip.AddrPort) *bootstrapEdge {
	t.Helper()
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.BootstrapKubeconfig = kubeconfig
	cfg.NodeName = node
	cfg.Gateway = []string{gw.ln.Addr().String()}
	cfg.GatewayCA = gw.caFile
	cfg.GatewayServerName = "gw.test"
	cfg.AllowPorts = Ports{echo.Port()}
	cfg.APIServerListen = freePort(t)
	cfg.AdminListen = freePort(t)
	cfg.PoolListen = ""
	cfg.TopologyComponents = nil
	cfg.DataDir = dir
	tl := &testLog{t: t}
	t.Cleanup(tl.stop) // after Run's, registered by start
	cfg.Logger = slog.New(slog.NewTextHandler(tl, nil))
	return &bootstrapEdge{cfg: cfg, dataDir: dir}
}

func startBootstrapEdge(t *testing.T, kubeconfig, node string, gw *testGateway, echo netip.AddrPort) *bootstrapEdge {
	t.Helper()
	e := newBootstrapEdge(t, kubeconfig, node, gw, echo)
	e.start(t)
	return e
}

func (e *bootstrapEdge) start(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, e.cfg) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}

// client is a kubelet's client of the edge's apiserver proxy.
func (e *bootstrapEdge) client(t *testing.T) kubernetes.Interface {
	return kubernetes.NewForConfigOrDie(&rest.Config{Host: "http://" + e.cfg.APIServerListen, UserAgent: "kubelet/v1.36.3"})
}

func (e *bootstrapEdge) metrics(t *testing.T) string {
	t.Helper()
	resp, err := http.Get("http://" + e.cfg.AdminListen + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// testGateway is a minimal gateway: a QUIC listener that verifies the
// edges' client certificates against the cluster CA.
type testGateway struct {
	ln     *quic.Listener
	caFile string
}

func startTestGateway(t *testing.T, ca *testenv.CA) *testGateway {
	t.Helper()
	srv, err := ca.ServerCert("gateway", "gw.test")
	if err != nil {
		t.Fatal(err)
	}
	caFile, err := ca.WriteFile(t.TempDir(), "gateway-ca")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := quic.ListenAddr("127.0.0.1:0",
		tunnel.ServerTLS(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &srv.TLS, nil }, ca.Pool()),
		tunnel.QUICConfig(tunnel.Limits{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return &testGateway{ln: ln, caFile: caFile}
}

func (g *testGateway) accept(ctx context.Context, t *testing.T) *quic.Conn {
	t.Helper()
	actx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c, err := g.ln.Accept(actx)
	if err != nil {
		t.Fatalf("no tunnel connection: %v", err)
	}
	return c
}

func peerCert(t *testing.T, c *quic.Conn) *x509.Certificate {
	t.Helper()
	certs := c.ConnectionState().TLS.PeerCertificates
	if len(certs) == 0 {
		t.Fatal("no client certificate")
	}
	return certs[0]
}

// openEcho opens a stream to the echo server through the edge.
func openEcho(ctx context.Context, t *testing.T, c *quic.Conn, echo netip.AddrPort) *quic.Stream {
	t.Helper()
	s, err := c.OpenStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tunnel.WriteRequest(s, tunnel.Request{Dest: echo}); err != nil {
		t.Fatal(err)
	}
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	if rep, err := tunnel.ReadReply(s); err != nil {
		t.Fatalf("reply %+v, %v", rep, err)
	}
	return s
}

func roundTrip(t *testing.T, s *quic.Stream, msg string) {
	t.Helper()
	if _, err := s.Write([]byte(msg)); err != nil {
		t.Fatalf("write to the relayed connection: %v", err)
	}
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(s, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo %q, %v", buf, err)
	}
}

// testLog writes log lines to the test's log while it runs.
type testLog struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (l *testLog) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.done = true
}

func (l *testLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.t.Log(string(bytes.TrimRight(p, "\n")))
	}
	return len(p), nil
}
