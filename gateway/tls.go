package gateway

import (
	"crypto/x509"
	"fmt"
	"log/slog"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"

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
// (selfca).
type tlsSource struct {
	serving   *certfile.KeyPair
	clientCAs *certfile.CAs
	ca        *selfca.Authority // nil unless self-managed
}

// loadTLS reads the serving certificate and --client-ca, setting up the
// self-managed CA first if there are no --tls-cert/--tls-key; they must
// load now.
func loadTLS(cfg Config, log *slog.Logger) (*tlsSource, error) {
	s := &tlsSource{}
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
	var err error
	if s.serving, err = certfile.LoadKeyPair(certFile, keyFile, certfile.Options{Name: what, Logger: log}); err != nil {
		return nil, err
	}
	if s.clientCAs, err = certfile.LoadCAs(cfg.ClientCA, certfile.Options{Name: "--client-ca", Logger: log}); err != nil {
		return nil, err
	}
	return s, nil
}

// resetKey is the QUIC stateless reset key: derived from the self-managed
// CA's key, which outlives every serving certificate, or else from the
// serving key at start.
func (s *tlsSource) resetKey() (*quic.StatelessResetKey, error) {
	if s.ca != nil {
		return tunnel.StatelessResetKey(s.ca.CAKey())
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
	if s.ca == nil {
		http.Error(w, "this gateway's serving certificate comes from --tls-cert: edges need the CA that issued it, which the gateway does not have", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/x-pem-file")
	w.Write(s.ca.CAPEM())
}

var descNotAfter = prometheus.NewDesc("tether_gateway_certificate_expiry_timestamp_seconds",
	"When a certificate the gateway uses expires (Unix time): cert=serving (--tls-cert, what edges verify) or client-ca (the first of --client-ca's CAs to expire). Read from the files in use when scraped.",
	[]string{"cert"}, nil)

// Describe and Collect make tlsSource a Prometheus collector of its
// certificates' expiry, so that an alert can fire before edges start
// refusing the gateway, or it them.
func (s *tlsSource) Describe(ch chan<- *prometheus.Desc) { ch <- descNotAfter }

func (s *tlsSource) Collect(ch chan<- prometheus.Metric) {
	if c, err := s.serving.Certificate(); err == nil && c.Leaf != nil {
		ch <- prometheus.MustNewConstMetric(descNotAfter, prometheus.GaugeValue, float64(c.Leaf.NotAfter.Unix()), "serving")
	}
	var first *x509.Certificate
	for _, c := range s.clientCAs.Certificates() {
		if first == nil || c.NotAfter.Before(first.NotAfter) {
			first = c
		}
	}
	if first != nil {
		ch <- prometheus.MustNewConstMetric(descNotAfter, prometheus.GaugeValue, float64(first.NotAfter.Unix()), "client-ca")
	}
}
