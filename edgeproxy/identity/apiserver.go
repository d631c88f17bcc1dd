package identity

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/tether-edge/tether/internal/certfile"
)

// APIServerAccess is how the apiserver proxy reaches the cloud: the
// servers, the TLS settings with the node's client certificate, and the
// node name that certificate holds ("" if none).
type APIServerAccess struct {
	Servers []string
	TLS     *tls.Config
	Token   string
	Node    string
	// Cert is the client certificate (nil with a token): the one the
	// identity holds, so that a rotation moves to new connections.
	Cert *Cert
}

// APIServer is the apiserver proxy's access: --kubeconfig, or
// --server-addr with --cert, --key and --server-ca. --server-addr given
// with --kubeconfig replaces the kubeconfig's server; --server-ca replaces
// its CA. A client certificate in files is read again when the files
// change. With --bootstrap-kubeconfig, the bootstrap kubeconfig gives the
// server and CA and the certificate obtained through the CSR API is the
// client certificate. Certificate files are the identity's, loaded once.
// The identity learns the node name of the credentials if it knows none
// yet.
func (id *Identity) APIServer() (*APIServerAccess, error) {
	c := id.opts
	boot := id.bootstrapped()
	a := &APIServerAccess{Servers: c.ServerAddr, TLS: &tls.Config{MinVersion: tls.VersionTLS12}}
	certFile, keyFile := c.Cert, c.Key
	var certPEM, keyPEM, caPEM []byte
	kubeconfig, flag := c.Kubeconfig, "--kubeconfig"
	if boot != nil {
		kubeconfig, flag = c.BootstrapKubeconfig, "--bootstrap-kubeconfig"
	}
	if kubeconfig != "" {
		rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err)
		}
		if len(a.Servers) == 0 {
			a.Servers = []string{rc.Host}
		}
		a.TLS.ServerName = rc.ServerName
		a.TLS.InsecureSkipVerify = rc.Insecure
		caPEM = rc.CAData
		if len(caPEM) == 0 && rc.CAFile != "" {
			if caPEM, err = os.ReadFile(rc.CAFile); err != nil {
				return nil, fmt.Errorf("%s: certificate-authority: %w", flag, err)
			}
		}
		// The bootstrap kubeconfig's credentials are for the CSR API only.
		if boot == nil {
			if rc.CertFile != "" || len(rc.CertData) > 0 {
				certFile, keyFile = rc.CertFile, rc.KeyFile
				certPEM, keyPEM = rc.CertData, rc.KeyData
			}
			a.Token = rc.BearerToken
			if a.Token == "" && rc.BearerTokenFile != "" {
				b, err := os.ReadFile(rc.BearerTokenFile)
				if err != nil {
					return nil, fmt.Errorf("--kubeconfig: token file: %w", err)
				}
				a.Token = strings.TrimSpace(string(b))
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
		a.TLS.RootCAs = pool
	}
	switch {
	case boot != nil:
		a.Cert = boot
	case len(certPEM) > 0:
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("--kubeconfig: client certificate: %w", err)
		}
		a.Cert = fixed(cert)
	case certFile != "":
		if keyFile == "" {
			keyFile = certFile
		}
		var err error
		if a.Cert, err = id.files(certFile, keyFile); err != nil {
			return nil, err
		}
	case a.Token == "":
		return nil, errors.New("no credentials for the apiserver: give --cert and --key, or a --kubeconfig with a client certificate or token")
	}
	if a.Cert != nil {
		a.TLS.GetClientCertificate = a.Cert.GetClientCertificate
		a.Node, _ = a.Cert.NodeName()
	}
	id.learn(a.Node)
	return a, nil
}

// Pool is the certificate the pool's peers see (the apiserver proxy's)
// and the CAs their certificates are checked against: poolCA's (--pool-ca),
// else the apiserver's CA.
func (a *APIServerAccess) Pool(poolCA string, log *slog.Logger) (func() (*tls.Certificate, error), func() *x509.CertPool, error) {
	if a.Cert == nil {
		return nil, nil, errors.New("node pool: peers are authenticated with the node's client certificate, and the apiserver credentials hold none")
	}
	cert := func() (*tls.Certificate, error) { return a.Cert.GetClientCertificate(nil) }
	if poolCA != "" {
		cas, err := certfile.LoadCAs(poolCA, certfile.Options{Logger: log})
		if err != nil {
			return nil, nil, fmt.Errorf("--pool-ca: %w", err)
		}
		return cert, cas.Pool, nil
	}
	if roots := a.TLS.RootCAs; roots != nil {
		return cert, func() *x509.CertPool { return roots }, nil
	}
	return nil, nil, errors.New("node pool: give --pool-ca (the CA of the nodes' client certificates); the apiserver CA is not known either")
}
