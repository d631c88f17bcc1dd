package gateway

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/gateway/internal/edgetest"
	"github.com/tether-edge/tether/internal/testenv"
)

const acmeDomain = "gw.tether.test"

// acmeGateway edits a gateway's configuration for ACME mode against
// Pebble: the challenge listener on host:port, which Pebble dials.
func acmeGateway(p *testenv.Pebble, clientCA, host string, port int, storage string) func(*Config) {
	return func(c *Config) {
		c.ClientCA, c.TLSCert, c.TLSKey = clientCA, "", ""
		c.ACMEDomains = []string{acmeDomain}
		c.ACMECA, c.ACMECARoot = p.DirectoryURL, p.ServerCAFile
		c.ACMEHTTPListen = net.JoinHostPort(host, strconv.Itoa(port))
		if storage != "" {
			c.ACMEStorage = storage
		}
	}
}

// dialACMEEdge connects a test edge for node that verifies the gateway as
// acmeDomain against roots, and returns it with the certificate it saw.
func dialACMEEdge(t *testing.T, g *Gateway, ca *testenv.CA, node string, roots *x509.CertPool) (*edgetest.Edge, *x509.Certificate) {
	t.Helper()
	kp, err := ca.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := edgetest.Dial(ctx, g.TunnelAddr().String(), edgetest.Options{Cert: kp.TLS, Roots: roots, ServerName: acmeDomain})
	if err != nil {
		t.Fatalf("edge %s: %v", node, err)
	}
	t.Cleanup(e.Close)
	testenv.Eventually(t, node+" registered", func() bool { _, ok := g.registry.Lookup(node); return ok })
	return e, e.Conn().ConnectionState().TLS.PeerCertificates[0]
}

func waitReady(t *testing.T, g *Gateway, within time.Duration) {
	t.Helper()
	testenv.EventuallyWithin(t, within, "the gateway ready", func() bool { return g.Ready() == nil })
}

// serialHex is a certificate's serial as Pebble logs it (hex, in whole
// bytes).
func serialHex(c *x509.Certificate) string { return fmt.Sprintf("%x", c.SerialNumber.Bytes()) }

// TestACME: the gateway obtains its serving certificate from Pebble, which
// validates HTTP-01 for real against the gateway's challenge listener; the
// QUIC listener serves it (verified against Pebble's issuing root); the
// certificate is renewed before it expires and new handshakes get the new
// one while a tunnel and a stream made with the old one stay up.
func TestACME(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	httpPort := testenv.FreeLoopbackPort(t)
	// Certificates of 12 s, renewed with three quarters of their life left
	// (or when ARI, which Pebble serves, says so).
	p := testenv.StartPebble(t, testenv.PebbleOptions{
		HTTPPort:     httpPort,
		Hosts:        map[string]string{acmeDomain: "127.0.0.1"},
		CertValidity: 12 * time.Second,
	})
	dir := t.TempDir()
	edgeCA := testenv.MustCA(t, "cluster CA")
	caFile, err := edgeCA.WriteFile(dir, "client-ca")
	if err != nil {
		t.Fatal(err)
	}
	g, stop := startTLSGateway(t, cp, func(c *Config) {
		acmeGateway(p, caFile, "127.0.0.1", httpPort, "")(c)
		c.DataDir = filepath.Join(dir, "data")
		c.ACMERenewCheckInterval = 500 * time.Millisecond
		c.ACMERenewalWindowRatio = 0.75
	})
	t.Cleanup(stop)
	if g.Ready() == nil {
		t.Fatal("ready before it has a certificate")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	issued, err := p.WaitIssued(ctx, 1)
	if err != nil {
		t.Fatalf("%v\n%s", err, p.Log())
	}
	waitReady(t, g, 10*time.Second)
	if !strings.Contains(p.Log(), "Attempting to validate w/ HTTP: http://"+acmeDomain+":"+strconv.Itoa(httpPort)) {
		t.Errorf("pebble did not validate over HTTP:\n%s", p.Log())
	}

	roots := p.IssuingRoots(t)
	edge1, first := dialACMEEdge(t, g, edgeCA, "edge-1", roots)
	if serialHex(first) != issued[0] {
		t.Errorf("edge-1 saw serial %s, Pebble issued %s", serialHex(first), issued[0])
	}
	admin := "http://" + g.AdminAddr().String()
	want := fmt.Sprintf(`tether_gateway_certificate_expiry_timestamp_seconds{cert="serving"} %g`, float64(first.NotAfter.Unix()))
	if m := httpGet(t, admin+"/metrics"); !strings.Contains(m, want) {
		t.Errorf("/metrics lacks %s", want)
	}
	s := openEcho(t, g, "edge-1")
	s.roundTrip("with the first certificate")

	// Renewal: a second certificate, which the next handshake gets.
	if _, err := p.WaitIssued(ctx, 2); err != nil {
		t.Fatalf("no renewal: %v\n%s", err, p.Log())
	}
	var second *x509.Certificate
	testenv.Eventually(t, "a new handshake gets the renewed certificate", func() bool {
		_, second = dialACMEEdge(t, g, edgeCA, "edge-2", roots)
		return serialHex(second) != serialHex(first)
	})
	if issued = p.Issued(); !slices.Contains(issued, serialHex(second)) {
		t.Errorf("edge-2 saw serial %s, which Pebble did not issue (%v)", serialHex(second), issued)
	}
	if !second.NotAfter.After(first.NotAfter) {
		t.Errorf("renewed certificate expires %v, the first %v", second.NotAfter, first.NotAfter)
	}
	s.roundTrip("after the renewal")
	if _, closed := edge1.CloseCode(); closed {
		t.Fatal("edge-1's tunnel was closed by the renewal")
	}
	s.close()
	if accounts := p.Accounts(); accounts != 1 {
		t.Errorf("pebble has %d accounts, want 1", accounts)
	}

	// A restart finds the account, the certificate and the reset key in
	// --data-dir/acme: it is ready from the storage, with the same
	// stateless reset key and no new account.
	key1, err := g.certs.resetKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	g2, stop2 := startTLSGateway(t, cp, func(c *Config) {
		acmeGateway(p, caFile, "127.0.0.1", httpPort, "")(c)
		c.DataDir = filepath.Join(dir, "data")
	})
	t.Cleanup(stop2)
	waitReady(t, g2, 2*time.Second)
	key2, err := g2.certs.resetKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if *key1 != *key2 {
		t.Error("the stateless reset key changed across a restart")
	}
	if p.Accounts() != 1 {
		t.Errorf("restarted gateway registered another account")
	}
}

// TestACMESharedSecret: two gateway replicas with their ACME state in one
// Secret of a real kube-apiserver, each as the user tether-gateway with the
// RBAC that packaging/kubernetes/gateway-rbac.yaml ships, obtain exactly
// one certificate with one account, and both serve it. Pebble dials only
// the first replica's challenge listener: when the second replica is the
// one that ordered, the first answers from the Secret.
func TestACMESharedSecret(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rbac := filepath.Join("..", "packaging", "kubernetes", "gateway-rbac.yaml")
	if err := testenv.ApplyManifests(ctx, cp.Admin, false, rbac); err != nil {
		t.Fatal(err)
	}
	kp, err := cp.CA.ClientCert("tether-gateway")
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := cp.Kubeconfig(t, "tether-gateway", kp)
	for _, c := range []struct {
		verb, name string
		allowed    bool
	}{
		{"get", "tether-gateway-acme", true},
		{"update", "tether-gateway-acme", true},
		{"get", "other", false},
		{"update", "other", false},
		{"list", "", false},
	} {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:               "tether-gateway",
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: c.verb, Resource: "secrets", Namespace: "tether-system", Name: c.name},
		}}
		// The authorizer sees new RBAC objects through its informers, a
		// moment after they are stored: the allowed ones (first) are
		// asked again for a while.
		var res *authorizationv1.SubjectAccessReview
		ask := func() bool {
			if res, err = cp.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			return res.Status.Allowed
		}
		if c.allowed {
			testenv.Eventually(t, fmt.Sprintf("tether-gateway allowed to %s secret %q", c.verb, c.name), ask)
		} else if ask() {
			t.Errorf("tether-gateway may %s secret %q, want not", c.verb, c.name)
		}
	}

	httpPort := testenv.FreeLoopbackPort(t)
	p := testenv.StartPebble(t, testenv.PebbleOptions{HTTPPort: httpPort, Hosts: map[string]string{acmeDomain: "127.0.0.1"}})
	dir := t.TempDir()
	edgeCA := testenv.MustCA(t, "cluster CA")
	caFile, err := edgeCA.WriteFile(dir, "client-ca")
	if err != nil {
		t.Fatal(err)
	}
	const storage = "secret:tether-system/tether-gateway-acme"
	var gws []*Gateway
	for i, host := range []string{"127.0.0.1", "127.0.0.2"} {
		g, stop := startTLSGateway(t, cp, func(c *Config) {
			acmeGateway(p, caFile, host, httpPort, storage)(c)
			c.Kubeconfig = kubeconfig
			c.DataDir = filepath.Join(dir, "data-"+strconv.Itoa(i))
		})
		t.Cleanup(stop)
		gws = append(gws, g)
	}
	for _, g := range gws {
		waitReady(t, g, 30*time.Second)
	}
	issued := p.Issued()
	if len(issued) != 1 || p.Accounts() != 1 {
		t.Fatalf("pebble issued %d certificates (%v) to %d accounts, want 1 and 1\n%s", len(issued), issued, p.Accounts(), p.Log())
	}
	roots := p.IssuingRoots(t)
	for i, g := range gws {
		_, seen := dialACMEEdge(t, g, edgeCA, "edge-"+strconv.Itoa(i), roots)
		if serialHex(seen) != issued[0] {
			t.Errorf("replica %d serves serial %s, Pebble issued %s", i, serialHex(seen), issued[0])
		}
	}
	sec, err := cp.Client.CoreV1().Secrets("tether-system").Get(ctx, "tether-gateway-acme", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range sec.Data {
		keys = append(keys, k)
	}
	t.Logf("Secret entries: %v", keys)
	for k := range sec.Annotations {
		if strings.HasPrefix(k, "acme.tether.io/lock-") {
			t.Errorf("a lock is left in the Secret: %s=%s", k, sec.Annotations[k])
		}
	}
}

func TestValidateACME(t *testing.T) {
	valid := DefaultConfig()
	valid.ClientCA, valid.ACMEDomains = "/ca.pem", []string{"gw.example.com"}
	if err := valid.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	if valid.SelfManagedTLS() || !valid.ACME() {
		t.Fatal("--acme-domain is not ACME mode")
	}
	secret := valid
	secret.ACMEStorage, secret.DataDir = "secret:tether-system/tether-gateway-acme", ""
	if err := secret.Validate(); err != nil {
		t.Fatalf("secret storage without a data dir: %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"with tls-cert", func(c *Config) { c.TLSCert, c.TLSKey = "/gw.pem", "/gw.key" }, "--acme-domain and --tls-cert/--tls-key exclude each other"},
		{"wildcard", func(c *Config) { c.ACMEDomains = []string{"*.example.com"} }, "cannot validate a wildcard"},
		{"address", func(c *Config) { c.ACMEDomains = []string{"203.0.113.10"} }, "not an address"},
		{"bare name", func(c *Config) { c.ACMEDomains = []string{"gateway"} }, "fully qualified"},
		{"http CA", func(c *Config) { c.ACMECA = "http://ca.example.com/dir" }, "--acme-ca"},
		{"bad storage", func(c *Config) { c.ACMEStorage = "s3://bucket" }, "want dir or secret:"},
		{"bad secret", func(c *Config) { c.ACMEStorage = "secret:tether-system" }, "secret:<namespace>/<name>"},
		{"dir without data dir", func(c *Config) { c.DataDir = "" }, "--data-dir is required with --acme-storage=dir"},
		{"no challenge listener", func(c *Config) { c.ACMEHTTPListen = "" }, "--acme-http-listen is required"},
		{"email without ACME", func(c *Config) { c.ACMEDomains, c.ACMEEmail = nil, "ops@example.com" }, "need --acme-domain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid
			tc.change(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
