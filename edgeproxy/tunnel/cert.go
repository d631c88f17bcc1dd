package edgetunnel

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/tether-edge/tether/tunnel"
)

// CertFiles is the node's client certificate, read from PEM files and
// read again when either file changes, so that a rotated certificate (the
// kubelet's kubelet-client-current.pem, which holds certificate and key in
// one file) is used for the next connection. Certificate and key may be
// the same file.
type CertFiles struct {
	certPath, keyPath string
	log               *slog.Logger

	mu                sync.Mutex
	cert              *tls.Certificate
	certStat, keyStat os.FileInfo
}

// LoadCertFiles reads the certificate and key; they must load now.
func LoadCertFiles(certPath, keyPath string, log *slog.Logger) (*CertFiles, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &CertFiles{certPath: certPath, keyPath: keyPath, log: log}
	if _, err := c.Certificate(); err != nil {
		return nil, err
	}
	return c, nil
}

// GetClientCertificate is for tls.Config.GetClientCertificate.
func (c *CertFiles) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return c.Certificate()
}

// Certificate returns the current certificate, reading the files again if
// they changed. If a changed file does not load (a rotation half written),
// the previous certificate is returned and the files are read again next
// time.
func (c *CertFiles) Certificate() (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cs, err1 := os.Stat(c.certPath)
	ks, err2 := os.Stat(c.keyPath)
	if err := errors.Join(err1, err2); err != nil {
		return c.keep(fmt.Errorf("client certificate: %w", err))
	}
	if c.cert != nil && sameFile(cs, c.certStat) && sameFile(ks, c.keyStat) {
		return c.cert, nil
	}
	cert, err := c.load()
	if err != nil {
		return c.keep(err)
	}
	if c.cert != nil {
		c.log.Info("client certificate changed; new connections use it",
			"cert", c.certPath, "subject", cert.Leaf.Subject.String(), "not_after", cert.Leaf.NotAfter)
	}
	c.cert, c.certStat, c.keyStat = cert, cs, ks
	return cert, nil
}

func (c *CertFiles) load() (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(c.certPath)
	if err != nil {
		return nil, fmt.Errorf("read client certificate: %w", err)
	}
	keyPEM := certPEM
	if c.keyPath != c.certPath {
		if keyPEM, err = os.ReadFile(c.keyPath); err != nil {
			return nil, fmt.Errorf("read client key: %w", err)
		}
	}
	// X509KeyPair skips the blocks of the other kind, so one file holding
	// both certificate and key works as either argument.
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("load client certificate %s and key %s: %w", c.certPath, c.keyPath, err)
	}
	return &cert, nil
}

func (c *CertFiles) keep(err error) (*tls.Certificate, error) {
	if c.cert == nil {
		return nil, err
	}
	c.log.Warn("cannot reload the client certificate; using the previous one", "err", err)
	return c.cert, nil
}

// NodeName is the node the current certificate names
// (CN=system:node:<name>), as the gateway will read it.
func (c *CertFiles) NodeName() (string, error) {
	cert, err := c.Certificate()
	if err != nil {
		return "", err
	}
	return tunnel.NodeName(cert.Leaf)
}

func sameFile(a, b os.FileInfo) bool {
	return b != nil && os.SameFile(a, b) && a.ModTime().Equal(b.ModTime()) && a.Size() == b.Size()
}
