package testenv

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// The test PKI issues ECDSA P-256 keys: they are fast to generate and every
// peer Tether's tests use (Go, kube-apiserver, curl) accepts them.
//
// The functions here return errors rather than taking a T, so that code
// outside tests can use them too; MustCA is the one T-taking shortcut.

const (
	// defaultValidity is how long a certificate lives when its Template
	// gives no NotAfter: long enough for any test run.
	defaultValidity = 24 * time.Hour
	// clockSkew backdates NotBefore so that a certificate is valid at once
	// even for a peer whose clock is slightly behind.
	clockSkew = time.Minute
	// caValidity is how far a CA's window reaches both ways from now, so
	// that it covers certificates issued with windows in the past (to test
	// expiry) or far ahead.
	caValidity = 10 * 365 * 24 * time.Hour
)

// CA is a self-signed certificate authority that issues test certificates.
type CA struct {
	Cert    *x509.Certificate
	Key     crypto.Signer
	CertPEM []byte
}

// KeyPair is an issued certificate with its private key, in the forms the
// different consumers want: PEM for files and kubeconfigs, parsed for
// inspection, tls.Certificate for Go TLS configs.
type KeyPair struct {
	CertPEM, KeyPEM []byte
	Cert            *x509.Certificate
	TLS             tls.Certificate
}

// Template describes a certificate for CA.Issue. Zero NotBefore means now
// (minus a minute of clock skew); zero NotAfter means a day after NotBefore.
type Template struct {
	CommonName    string
	Organizations []string
	// Hosts become subject alternative names: IP addresses go to
	// IPAddresses, anything else to DNSNames.
	Hosts       []string
	ExtKeyUsage []x509.ExtKeyUsage
	NotBefore   time.Time
	NotAfter    time.Time
}

// NewCA creates a CA with a fresh key and a self-signed certificate.
func NewCA(commonName string) (*CA, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl, err := certTemplate(Template{CommonName: commonName, NotBefore: now.Add(-caValidity), NotAfter: now.Add(caValidity)})
	if err != nil {
		return nil, err
	}
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature
	cert, certPEM, err := sign(tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("self-sign CA %q: %w", commonName, err)
	}
	return &CA{Cert: cert, Key: key, CertPEM: certPEM}, nil
}

// MustCA is NewCA for tests: it stops the test if the CA cannot be made.
func MustCA(t T, commonName string) *CA {
	t.Helper()
	ca, err := NewCA(commonName)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return ca
}

// Issue creates a key and a certificate for it, signed by the CA. The other
// issuing methods are shortcuts for common templates.
func (ca *CA) Issue(t Template) (*KeyPair, error) {
	key, err := newKey()
	if err != nil {
		return nil, err
	}
	cert, certPEM, err := ca.issue(t, key.Public())
	if err != nil {
		return nil, err
	}
	keyPEM, err := MarshalKeyPEM(key)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load key pair for %q: %w", t.CommonName, err)
	}
	return &KeyPair{CertPEM: certPEM, KeyPEM: keyPEM, Cert: cert, TLS: pair}, nil
}

// IssueFor issues a certificate for pub, a key held elsewhere (as a CSR's
// signer does), and returns it as PEM.
func (ca *CA) IssueFor(t Template, pub crypto.PublicKey) ([]byte, error) {
	_, certPEM, err := ca.issue(t, pub)
	return certPEM, err
}

func (ca *CA) issue(t Template, pub crypto.PublicKey) (*x509.Certificate, []byte, error) {
	tmpl, err := certTemplate(t)
	if err != nil {
		return nil, nil, err
	}
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = t.ExtKeyUsage
	cert, certPEM, err := sign(tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, nil, fmt.Errorf("issue certificate for %q: %w", t.CommonName, err)
	}
	return cert, certPEM, nil
}

// ServerCert issues a TLS server certificate valid for hosts (IP addresses
// or DNS names).
func (ca *CA) ServerCert(cn string, hosts ...string) (*KeyPair, error) {
	return ca.Issue(Template{
		CommonName:  cn,
		Hosts:       hosts,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

// ClientCert issues a TLS client certificate. Kubernetes reads the common
// name as the user name and the organizations as its groups.
func (ca *CA) ClientCert(cn string, orgs ...string) (*KeyPair, error) {
	return ca.Issue(Template{
		CommonName:    cn,
		Organizations: orgs,
		ExtKeyUsage:   []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

// NodeCert issues the client certificate of a Kubernetes node, as a kubelet
// or tether-edge holds it: CN=system:node:<node>, O=system:nodes plus
// extraOrgs (such as a group that RBAC binds).
func (ca *CA) NodeCert(node string, extraOrgs ...string) (*KeyPair, error) {
	orgs := append([]string{"system:nodes"}, extraOrgs...)
	return ca.ClientCert("system:node:"+node, orgs...)
}

// Pool returns a certificate pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return pool
}

// WriteFile writes the CA certificate as dir/base.crt and returns its path.
func (ca *CA) WriteFile(dir, base string) (string, error) {
	path := filepath.Join(dir, base+".crt")
	if err := os.WriteFile(path, ca.CertPEM, 0o644); err != nil {
		return "", fmt.Errorf("write CA certificate: %w", err)
	}
	return path, nil
}

// WriteFiles writes the certificate as dir/base.crt and the key as
// dir/base.key (mode 0600) and returns both paths.
func (kp *KeyPair) WriteFiles(dir, base string) (certFile, keyFile string, err error) {
	certFile = filepath.Join(dir, base+".crt")
	keyFile = filepath.Join(dir, base+".key")
	if err := os.WriteFile(certFile, kp.CertPEM, 0o644); err != nil {
		return "", "", fmt.Errorf("write certificate: %w", err)
	}
	if err := os.WriteFile(keyFile, kp.KeyPEM, 0o600); err != nil {
		return "", "", fmt.Errorf("write key: %w", err)
	}
	return certFile, keyFile, nil
}

// MarshalKeyPEM encodes a private key as a PKCS #8 "PRIVATE KEY" PEM block.
func MarshalKeyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("marshal private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func newKey() (*ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate ECDSA key: %w", err)
	}
	return key, nil
}

// certTemplate turns t into an x509 template with a random serial number,
// the validity window filled in and hosts split into IPs and DNS names.
func certTemplate(t Template) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, fmt.Errorf("generate serial number: %w", err)
	}
	notBefore, notAfter := t.NotBefore, t.NotAfter
	if notBefore.IsZero() {
		notBefore = time.Now().Add(-clockSkew)
	}
	if notAfter.IsZero() {
		notAfter = notBefore.Add(defaultValidity)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: t.CommonName, Organization: t.Organizations},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
	}
	for _, h := range t.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return tmpl, nil
}

// sign creates the certificate tmpl for pub, signed by parent's key, and
// returns it parsed and as PEM.
func sign(tmpl, parent *x509.Certificate, pub crypto.PublicKey, parentKey crypto.Signer) (*x509.Certificate, []byte, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}
