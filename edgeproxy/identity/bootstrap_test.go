package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/tether-edge/tether/internal/testenv"
)

// storeCert writes kp where a certificate obtained through the CSR API is
// kept under dataDir.
func storeCert(t *testing.T, dataDir string, kp *testenv.KeyPair) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(dataDir, CertDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(CertPath(dataDir), append(append([]byte{}, kp.CertPEM...), kp.KeyPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestBootstrapPresentsOneCertificate: with --bootstrap-kubeconfig and a
// valid certificate for the node in --data-dir, the tunnel, the apiserver
// proxy and the pool listener all present that certificate, at once and
// without a request (the kubeconfig's server is unreachable).
func TestBootstrapPresentsOneCertificate(t *testing.T) {
	ca := testenv.MustCA(t, "identity-test")
	kp, _ := ca.NodeCert("edge-7")
	dir, dataDir := t.TempDir(), t.TempDir()
	storeCert(t, dataDir, kp)
	caFile, err := ca.WriteFile(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	other, _ := ca.NodeCert("edge-other") // the bootstrap kubeconfig's own credentials
	reg := prometheus.NewRegistry()
	id := start(t, Options{NodeName: "edge-7", BootstrapKubeconfig: writeKubeconfig(t, dir, other, "", "", true),
		DataDir: dataDir, Registerer: reg})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.WaitBound)
	defer cancel()
	if !id.Wait(ctx) {
		t.Fatal("no certificate")
	}
	tun, err := id.Tunnel()
	if err != nil {
		t.Fatal(err)
	}
	acc, err := id.APIServer()
	if err != nil {
		t.Fatal(err)
	}
	poolCert, _, err := acc.Pool(caFile, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for what, get := range map[string]func() (string, error){
		"tunnel":          func() (string, error) { c, err := tun.GetClientCertificate(nil); return serial(c), err },
		"apiserver proxy": func() (string, error) { c, err := acc.TLS.GetClientCertificate(nil); return serial(c), err },
		"pool":            func() (string, error) { c, err := poolCert(); return serial(c), err },
	} {
		if got, err := get(); err != nil || got != kp.Cert.SerialNumber.String() {
			t.Errorf("%s presents %s, %v; want the stored %s", what, got, err, kp.Cert.SerialNumber)
		}
	}
	if id.Name() != "edge-7" || acc.Node != "edge-7" {
		t.Errorf("node %q, apiserver credentials' %q", id.Name(), acc.Node)
	}
	if got, want := value(t, id.boot.metrics.expiry), float64(kp.Cert.NotAfter.Unix()); got != want {
		t.Errorf("expiry gauge %v, want %v", got, want)
	}
	if n := value(t, id.boot.metrics.renewFailures); n != 0 {
		t.Errorf("%v renewal failures without a request", n)
	}
}

// TestBootstrapRefusesAnotherNodesCertificate: a certificate in --data-dir
// for another node (--node-name changed) is never presented; the edge
// requests its own at once (refused here: the apiserver is unreachable,
// which the failure counter shows).
func TestBootstrapRefusesAnotherNodesCertificate(t *testing.T) {
	ca := testenv.MustCA(t, "identity-test")
	kp, _ := ca.NodeCert("edge-other")
	dir, dataDir := t.TempDir(), t.TempDir()
	storeCert(t, dataDir, kp)
	id := start(t, Options{NodeName: "edge-7", BootstrapKubeconfig: writeKubeconfig(t, dir, kp, "", "", true),
		DataDir: dataDir, Registerer: prometheus.NewRegistry()})
	tun, err := id.Tunnel()
	if err != nil {
		t.Fatal(err)
	}
	testenv.Never(t, "the other node's certificate presented",
		func() bool { c, _ := tun.GetClientCertificate(nil); return c != nil },
		func() bool { return value(t, id.boot.metrics.renewFailures) >= 1 })
	if _, err := tun.GetClientCertificate(nil); err == nil {
		t.Error("a certificate presented before one is issued")
	}
}

// serial is the serial number of c's leaf ("" for none).
func serial(c *tls.Certificate) string {
	if c == nil || len(c.Certificate) == 0 {
		return ""
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return ""
	}
	return leaf.SerialNumber.String()
}

// value is the value of a counter or gauge.
func value(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}
