package gateway

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/caddyserver/certmagic"
	"github.com/quic-go/quic-go"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/gateway/acme"
	"github.com/tether-edge/tether/gateway/acmestore"
	"github.com/tether-edge/tether/gateway/selfca"
	"github.com/tether-edge/tether/internal/certfile"
	"github.com/tether-edge/tether/tunnel"
)

// tlsSource is the gateway's TLS material: the serving certificate edges
// verify, and the CAs edges' client certificates are verified against.
// Both are read from files again when they change (certfile), so a
// rotation needs no restart and drops no tunnel: the next handshake uses
// the new files, and the tunnels up keep the certificates they were made
// with (the tunnel server verifies their client certificates again every
// minute against the CAs of the moment).
//
// The serving certificate's files are --tls-cert/--tls-key, or, without
// them, those of the self-managed CA in --data-dir, which renews them
// (selfca). In ACME mode (--acme-domain) there are no files: certmagic
// obtains and renews the certificate and handshakes take it from its
// cache (gateway/acme).
type tlsSource struct {
	serving   *certfile.KeyPair // nil in ACME mode
	clientCAs *certfile.CAs
	ca        *selfca.Authority // nil unless self-managed
	acme      *acme.Manager     // nil unless ACME mode
	acmeDesc  string            // ACME mode: the CA, for /ca.crt's answer
	// acmeDomains are the --acme-domain names in ACME mode.
	acmeDomains []string
}

// loadTLS reads the serving certificate and --client-ca, setting up the
// self-managed CA first if there are no --tls-cert/--tls-key, or the ACME
// manager in ACME mode (acmeLn is its bound challenge listener); the files
// must load now.
func loadTLS(cfg Config, log *slog.Logger, client kubernetes.Interface, acmeLn net.Listener) (*tlsSource, error) {
	s := &tlsSource{}
	var err error
	if s.clientCAs, err = certfile.LoadCAs(cfg.ClientCA, certfile.Options{Name: "--client-ca", Logger: log}); err != nil {
		return nil, err
	}
	if cfg.ACME() {
		if len(cfg.ServerNames) > 0 {
			log.Warn("--server-name is ignored with --acme-domain: the certificate names the --acme-domain names", "server_name", cfg.ServerNames)
		}
		if s.acme, err = newACME(cfg, log, client, acmeLn); err != nil {
			return nil, err
		}
		s.acmeDesc, s.acmeDomains = cfg.ACMECA, cfg.ACMEDomains
		return s, nil
	}
	certFile, keyFile, what := cfg.TLSCert, cfg.TLSKey, "--tls-cert/--tls-key"
	if cfg.SelfManagedTLS() {
		names := cfg.ServerNames
		if len(names) == 0 {
			host, err := os.Hostname()
			if err != nil {
				return nil, fmt.Errorf("no --server-name, and no host name to use instead: %w", err)
			}
			names = []string{host}
			log.Warn("no --server-name: the self-managed serving certificate names only the host name; give the names and addresses edges dial", "name", host)
		}
		ca, err := selfca.Open(selfca.Options{Dir: cfg.DataDir, Names: names, Logger: log})
		if err != nil {
			return nil, fmt.Errorf("self-managed TLS (no --tls-cert/--tls-key): %w (give --data-dir a directory the gateway may write, or give --tls-cert and --tls-key)", err)
		}
		s.ca, certFile, keyFile, what = ca, ca.CertFile(), ca.KeyFile(), "self-managed serving certificate"
		log.Info("self-managed TLS: the gateway's own CA issues its serving certificate; edges need the CA (`tetherctl ca`, or GET /ca.crt on the admin port) as their --gateway-ca",
			"data_dir", cfg.DataDir, "names", names)
	}
	if s.serving, err = certfile.LoadKeyPair(certFile, keyFile, certfile.Options{Name: what, Logger: log}); err != nil {
		return nil, err
	}
	return s, nil
}

// newACME sets up ACME mode: the storage (--data-dir/acme, or a Secret)
// and the certmagic manager, told about the challenge listener.
func newACME(cfg Config, log *slog.Logger, client kubernetes.Interface, ln net.Listener) (*acme.Manager, error) {
	var storage certmagic.Storage
	ns, name, secret, err := cfg.ACMESecret()
	if err != nil {
		return nil, err
	}
	if secret {
		if storage, err = acmestore.New(client, acmestore.Options{Namespace: ns, Name: name, Logger: log}); err != nil {
			return nil, err
		}
	} else {
		dir := filepath.Join(cfg.DataDir, "acme")
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("ACME storage (--acme-storage=dir): %w (give --data-dir a directory the gateway may write)", err)
		}
		storage = &certmagic.FileStorage{Path: dir}
	}
	var roots *x509.CertPool
	if cfg.ACMECARoot != "" {
		pem, err := os.ReadFile(cfg.ACMECARoot)
		if err != nil {
			return nil, fmt.Errorf("--acme-ca-root: %w", err)
		}
		certs, err := certfile.ParseCertificates(pem)
		if err != nil {
			return nil, fmt.Errorf("--acme-ca-root %s: %w", cfg.ACMECARoot, err)
		}
		roots = x509.NewCertPool()
		for _, c := range certs {
			roots.AddCert(c)
		}
	}
	host, _, _ := net.SplitHostPort(cfg.ACMEHTTPListen) // checked by Validate
	m, err := acme.New(acme.Options{
		Domains:            cfg.ACMEDomains,
		CA:                 cfg.ACMECA,
		Email:              cfg.ACMEEmail,
		CARoots:            roots,
		Storage:            storage,
		HTTPHost:           host,
		HTTPPort:           ln.Addr().(*net.TCPAddr).Port,
		RenewCheckInterval: cfg.ACMERenewCheckInterval,
		RenewalWindowRatio: cfg.ACMERenewalWindowRatio,
		Logger:             log,
	})
	if err != nil {
		return nil, err
	}
	log.Info("ACME mode: the serving certificate comes from an ACME CA; edges verify it with their --gateway-ca (default: the system roots)",
		"domains", cfg.ACMEDomains, "ca", cfg.ACMECA, "storage", fmt.Sprint(storage), "http_listen", ln.Addr().String())
	return m, nil
}

// getCertificate is the tunnel listener's tls.Config callback.
func (s *tlsSource) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if s.acme != nil {
		return s.acme.GetCertificate(hello)
	}
	return s.serving.GetCertificate(hello)
}

// feedSigner returns the key and chain (DER, leaf first) the pool feed
// signs with: the certificate the tunnel listener serves, in ACME mode
// that of the first --acme-domain.
func (s *tlsSource) feedSigner() (crypto.Signer, [][]byte, error) {
	hello := &tls.ClientHelloInfo{Conn: selfConn{}}
	if len(s.acmeDomains) > 0 {
		hello.ServerName = strings.Replace(s.acmeDomains[0], "*", "pool-feed", 1)
	}
	c, err := s.getCertificate(hello)
	if err != nil {
		return nil, nil, fmt.Errorf("serving certificate: %w", err)
	}
	if c == nil || len(c.Certificate) == 0 {
		return nil, nil, errors.New("no serving certificate yet")
	}
	key, ok := c.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("serving key of type %T cannot sign", c.PrivateKey)
	}
	return key, c.Certificate, nil
}

// selfConn is the connection of the ClientHello feedSigner asks with:
// certmagic logs its addresses.
type selfConn struct{ net.Conn }

func (selfConn) LocalAddr() net.Addr  { return &net.UDPAddr{IP: net.IPv6loopback} }
func (selfConn) RemoteAddr() net.Addr { return &net.UDPAddr{IP: net.IPv6loopback} }

// resetKey is the QUIC stateless reset key: derived from the self-managed
// CA's key, which outlives every serving certificate; in ACME mode from a
// key kept in the ACME storage for that purpose (acme.Manager.ResetKey),
// since the serving key changes at every renewal; or else from the
// serving key at start.
func (s *tlsSource) resetKey(ctx context.Context) (*quic.StatelessResetKey, error) {
	if s.ca != nil {
		return tunnel.StatelessResetKey(s.ca.CAKey())
	}
	if s.acme != nil {
		k, err := s.acme.ResetKey(ctx)
		if err != nil {
			return nil, err
		}
		return tunnel.StatelessResetKey(k)
	}
	c, err := s.serving.Certificate()
	if err != nil {
		return nil, err
	}
	return tunnel.StatelessResetKey(c.PrivateKey)
}

// serveCA is GET /ca.crt on the admin port: the CA edges need, in the
// self-managed mode.
func (s *tlsSource) serveCA(w http.ResponseWriter, r *http.Request) {
	if s.acme != nil {
		http.Error(w, "this gateway's serving certificate comes from the ACME CA "+s.acmeDesc+": edges need that CA's root (publicly trusted CAs are in the system roots, their default --gateway-ca)", http.StatusNotFound)
		return
	}
	if s.ca == nil {
		http.Error(w, "this gateway's serving certificate comes from --tls-cert: edges need the CA that issued it, which the gateway does not have", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/x-pem-file")
	w.Write(s.ca.CAPEM())
}

// servingLeaf is the serving certificate in use, nil while there is none
// (ACME mode before the first issuance).
func (s *tlsSource) servingLeaf() *x509.Certificate {
	if s.acme != nil {
		return s.acme.Leaf()
	}
	if c, err := s.serving.Certificate(); err == nil {
		return c.Leaf
	}
	return nil
}
