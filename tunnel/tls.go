package tunnel

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ALPN is the application protocol of a tunnel connection.
const ALPN = "tether/1"

const (
	nodeUserPrefix = "system:node:"
	nodesGroup     = "system:nodes"
)

// ErrNotANode is wrapped by NodeName's errors.
var ErrNotANode = errors.New("certificate does not name a node")

// NodeName returns the node a client certificate speaks for: its subject
// must be CN=system:node:<name> with O=system:nodes, the identity a kubelet
// has, and the name a valid node name. The certificate's chain must have
// been verified before; NodeName only reads it.
func NodeName(cert *x509.Certificate) (string, error) {
	cn := cert.Subject.CommonName
	name, ok := strings.CutPrefix(cn, nodeUserPrefix)
	if !ok {
		return "", fmt.Errorf("%w: CN %q lacks the %q prefix", ErrNotANode, cn, nodeUserPrefix)
	}
	if !slices.Contains(cert.Subject.Organization, nodesGroup) {
		return "", fmt.Errorf("%w: CN %q is not in group %s", ErrNotANode, cn, nodesGroup)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", fmt.Errorf("%w: %q: %s", ErrNotANode, name, strings.Join(errs, "; "))
	}
	return name, nil
}

// ServerTLS is the gateway's TLS configuration: TLS 1.3, ALPN tether/1,
// client certificates required and verified against clientCAs.
// getCert supplies the serving certificate (it may rotate).
func ServerTLS(getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error), clientCAs *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		NextProtos:     []string{ALPN},
		GetCertificate: getCert,
		ClientAuth:     tls.RequireAndVerifyClientCert,
		ClientCAs:      clientCAs,
	}
}

// ClientTLS is the edge's TLS configuration: it verifies the gateway
// against rootCAs (nil: the system pool) for serverName and presents the
// node's client certificate, which getCert may rotate.
func ClientTLS(getCert func(*tls.CertificateRequestInfo) (*tls.Certificate, error), rootCAs *x509.CertPool, serverName string) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		NextProtos:           []string{ALPN},
		ServerName:           serverName,
		RootCAs:              rootCAs,
		GetClientCertificate: getCert,
	}
}
