package edgetunnel

import (
	"log/slog"

	"github.com/tether-edge/tether/internal/certfile"
	"github.com/tether-edge/tether/tunnel"
)

// CertFiles is the node's client certificate, read from PEM files and
// read again when either file changes (certfile.KeyPair), so that a
// rotated certificate (the kubelet's kubelet-client-current.pem, which
// holds certificate and key in one file) is used for the next connection
// while the connections up keep going. Certificate and key may be the same
// file. A rotation half written leaves the previous certificate in use.
type CertFiles struct {
	*certfile.KeyPair
}

// LoadCertFiles reads the certificate and key; they must load now.
func LoadCertFiles(certPath, keyPath string, log *slog.Logger) (*CertFiles, error) {
	kp, err := certfile.LoadKeyPair(certPath, keyPath, certfile.Options{Name: "client certificate " + certPath, Logger: log})
	if err != nil {
		return nil, err
	}
	return &CertFiles{kp}, nil
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
