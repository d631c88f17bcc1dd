package testenv

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestPKIServerCertChainAndSANs(t *testing.T) {
	ca := MustCA(t, "test-ca")
	kp, err := ca.ServerCert("apiserver", "127.0.0.1", "localhost", "kubernetes.default.svc", "::1")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(kp.Cert.DNSNames, []string{"localhost", "kubernetes.default.svc"}) {
		t.Errorf("DNSNames = %v", kp.Cert.DNSNames)
	}
	if len(kp.Cert.IPAddresses) != 2 || !kp.Cert.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)) || !kp.Cert.IPAddresses[1].Equal(net.IPv6loopback) {
		t.Errorf("IPAddresses = %v", kp.Cert.IPAddresses)
	}
	for _, host := range []string{"127.0.0.1", "localhost", "kubernetes.default.svc", "::1"} {
		opts := x509.VerifyOptions{DNSName: host, Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
		if _, err := kp.Cert.Verify(opts); err != nil {
			t.Errorf("verify for %s: %v", host, err)
		}
	}
	if err := kp.Cert.VerifyHostname("example.com"); err == nil {
		t.Error("certificate verifies for example.com, which is not among its hosts")
	}
	// A server certificate is no client certificate.
	_, err = kp.Cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err == nil {
		t.Error("server certificate verifies for client auth")
	}
}

func TestPKINodeCert(t *testing.T) {
	ca := MustCA(t, "test-ca")
	kp, err := ca.NodeCert("node-a", "tether:edges")
	if err != nil {
		t.Fatal(err)
	}
	if got := kp.Cert.Subject.CommonName; got != "system:node:node-a" {
		t.Errorf("CN = %q", got)
	}
	if got := kp.Cert.Subject.Organization; !slices.Equal(got, []string{"system:nodes", "tether:edges"}) {
		t.Errorf("O = %v", got)
	}
	_, err = kp.Cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		t.Errorf("verify node certificate for client auth: %v", err)
	}
}

func TestPKIOtherCARejected(t *testing.T) {
	ca, other := MustCA(t, "test-ca"), MustCA(t, "other-ca")
	kp, err := other.ClientCert("mallory")
	if err != nil {
		t.Fatal(err)
	}
	_, err = kp.Cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if !errors.As(err, new(x509.UnknownAuthorityError)) {
		t.Errorf("verify against another CA: got %v, want UnknownAuthorityError", err)
	}
}

func TestPKIExpiredCertRejected(t *testing.T) {
	ca := MustCA(t, "test-ca")
	now := time.Now()
	kp, err := ca.Issue(Template{
		CommonName:  "expired",
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		NotBefore:   now.Add(-2 * time.Hour),
		NotAfter:    now.Add(-time.Hour),
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = kp.Cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	var invalid x509.CertificateInvalidError
	if !errors.As(err, &invalid) || invalid.Reason != x509.Expired {
		t.Errorf("verify expired certificate: got %v, want x509.Expired", err)
	}
	// The same certificate verifies at a time inside its window.
	_, err = kp.Cert.Verify(x509.VerifyOptions{Roots: ca.Pool(), CurrentTime: now.Add(-90 * time.Minute), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil {
		t.Errorf("verify inside validity window: %v", err)
	}
}

func TestPKIWriteFilesLoad(t *testing.T) {
	ca := MustCA(t, "test-ca")
	kp, err := ca.ClientCert("tether-admin", "system:masters")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile, err := kp.WriteFiles(dir, "admin")
	if err != nil {
		t.Fatal(err)
	}
	caFile, err := ca.WriteFile(dir, "ca")
	if err != nil {
		t.Fatal(err)
	}
	if certFile != filepath.Join(dir, "admin.crt") || keyFile != filepath.Join(dir, "admin.key") || caFile != filepath.Join(dir, "ca.crt") {
		t.Errorf("paths = %s %s %s", certFile, keyFile, caFile)
	}
	st, err := os.Stat(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key file mode = %v, want 0600", st.Mode().Perm())
	}
	loaded, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatalf("load written key pair: %v", err)
	}
	if !bytes.Equal(loaded.Certificate[0], kp.Cert.Raw) {
		t.Error("written certificate differs from the issued one")
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("written CA file holds no certificate")
	}
	if _, err := kp.Cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("verify against written CA file: %v", err)
	}
}

// TestPKIMutualTLS checks the key pairs where they are used: a TLS handshake
// in which each side verifies the other against the test CA.
func TestPKIMutualTLS(t *testing.T) {
	ca := MustCA(t, "test-ca")
	server, err := ca.ServerCert("server", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.NodeCert("node-a")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{server.TLS},
		ClientCAs:    ca.Pool(),
		ClientAuth:   tls.RequireAndVerifyClientCert,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	peer := make(chan string, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			peer <- err.Error()
			return
		}
		defer conn.Close()
		tc := conn.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			peer <- err.Error()
			return
		}
		peer <- tc.ConnectionState().PeerCertificates[0].Subject.CommonName
	}()
	conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{
		RootCAs:      ca.Pool(),
		Certificates: []tls.Certificate{client.TLS},
	})
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer conn.Close()
	if got := <-peer; got != "system:node:node-a" {
		t.Errorf("server saw client %q", got)
	}
}
