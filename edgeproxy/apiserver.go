package edgeproxy

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"k8s.io/client-go/tools/clientcmd"
)

// apiserverAccess is how the apiserver proxy reaches the cloud: the
// servers, the TLS settings with the node's client certificate, and the
// node name that certificate holds ("" if none).
type apiserverAccess struct {
	servers []string
	tls     *tls.Config
	token   string
	node    string
	// cert is the client certificate (nil with a token): the one the
	// identity holds, so that a rotation moves to new connections.
	cert *clientCert
}

// proxyConfigured reports whether the apiserver proxy has a way to the
// cloud.
func (c Config) proxyConfigured() bool {
	return c.Kubeconfig != "" || len(c.ServerAddr) > 0 || c.BootstrapKubeconfig != ""
}

// loadAPIServerAccess reads --kubeconfig, or --server-addr with --cert,
// --key and --server-ca. --server-addr given with --kubeconfig replaces
// the kubeconfig's server; --server-ca replaces its CA. A client
// certificate in files is read again when the files change. With
// --bootstrap-kubeconfig (id.nc not nil), the bootstrap kubeconfig gives
// the server and CA and id.nc the client certificate. Certificate files are
// the identity's, loaded once.
func loadAPIServerAccess(c Config, id *identity, log *slog.Logger) (*apiserverAccess, error) {
	nc := id.nc
	a := &apiserverAccess{servers: c.ServerAddr, tls: &tls.Config{MinVersion: tls.VersionTLS12}}
	certFile, keyFile := c.Cert, c.Key
	var certPEM, keyPEM, caPEM []byte
	kubeconfig, flag := c.Kubeconfig, "--kubeconfig"
	if nc != nil {
		kubeconfig, flag = c.BootstrapKubeconfig, "--bootstrap-kubeconfig"
	}
	if kubeconfig != "" {
		rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		if len(a.servers) == 0 {
			a.servers = []string{rc.Host}
		}
		a.tls.ServerName = rc.ServerName
		a.tls.InsecureSkipVerify = rc.Insecure
		caPEM = rc.CAData
		if len(caPEM) == 0 && rc.CAFile != "" {
			if caPEM, err = os.ReadFile(rc.CAFile); err != nil {
				return nil, fmt.Errorf("%s: certificate-authority: %w", flag, err)
			}
		}
		// The bootstrap kubeconfig's credentials are for the CSR API only.
		if nc == nil {
			if rc.CertFile != "" || len(rc.CertData) > 0 {
				certFile, keyFile = rc.CertFile, rc.KeyFile
				certPEM, keyPEM = rc.CertData, rc.KeyData
			}
			a.token = rc.BearerToken
			if a.token == "" && rc.BearerTokenFile != "" {
				b, err := os.ReadFile(rc.BearerTokenFile)
				if err != nil {
					return nil, fmt.Errorf("--kubeconfig: token file: %w", err)
				}
				a.token = strings.TrimSpace(string(b))
			}
		}
	}
	if c.ServerCA != "" {
		var err error
		if caPEM, err = os.ReadFile(c.ServerCA); err != nil {
			return nil, fmt.Errorf("--server-ca: %w", err)
		}
	}
	if len(caPEM) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, errors.New("the apiserver CA (--server-ca or the kubeconfig's certificate-authority) holds no PEM certificate")
		}
		a.tls.RootCAs = pool
	}
	switch {
	case nc != nil:
		a.cert = id.bootstrapped()
	case len(certPEM) > 0:
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig: client certificate: %w", err)
		}
		a.cert = fixed(cert)
	case certFile != "":
		if keyFile == "" {
			keyFile = certFile
		}
		var err error
		if a.cert, err = id.files(certFile, keyFile); err != nil {
			return nil, err
		}
	case a.token == "":
		return nil, errors.New("no credentials for the apiserver: give --cert and --key, or a --kubeconfig with a client certificate or token")
	}
	if a.cert != nil {
		a.tls.GetClientCertificate = a.cert.GetClientCertificate
		a.node, _ = a.cert.NodeName()
	}
	return a, nil
}
