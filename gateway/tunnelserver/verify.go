package tunnelserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/tether-edge/tether/tunnel"
)

// tlsConfig is the listener's TLS configuration: tunnel.ServerTLS, with
// the client certificate verified by verifyClient against the client CAs
// of the moment (see the package doc).
func (s *Server) tlsConfig(getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error), clientCAs func() *x509.CertPool) *tls.Config {
	base := tunnel.ServerTLS(getCert, nil)
	// Ask for a certificate and leave its verification to verifyClient,
	// which also refuses a connection without one.
	base.ClientAuth = tls.RequestClientCert
	base.SessionTicketsDisabled = true
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			c := base.Clone()
			pool := clientCAs()
			c.ClientCAs = pool // only the hint of acceptable CAs in the CertificateRequest
			var remote string
			if hello.Conn != nil { // quic-go sets it
				remote = hello.Conn.RemoteAddr().String()
			}
			c.VerifyConnection = func(cs tls.ConnectionState) error {
				return s.verifyClient(cs.PeerCertificates, pool, remote)
			}
			return c, nil
		},
	}
}

// verifyClient checks a client's certificate chain as crypto/tls's
// RequireAndVerifyClientCert would, and logs and counts a refusal.
func (s *Server) verifyClient(certs []*x509.Certificate, roots *x509.CertPool, remote string) error {
	err := verifyChain(certs, roots, s.now())
	if err == nil {
		return nil
	}
	reason := refusalReason(err)
	s.conns.WithLabelValues(reason).Inc()
	attrs := []any{"remote", remote, "reason", reason, "err", err}
	if len(certs) > 0 {
		attrs = append(attrs, "subject", certs[0].Subject.String(), "issuer", certs[0].Issuer.String(), "not_after", certs[0].NotAfter)
	}
	s.refused("tunnel refused: client certificate not accepted", attrs...)
	return err
}

var errNoCertificate = errors.New("no client certificate")

// verifyChain verifies the leaf certificate against roots, with the rest
// of certs as intermediates, for client authentication at time now.
func verifyChain(certs []*x509.Certificate, roots *x509.CertPool, now time.Time) error {
	if len(certs) == 0 {
		return errNoCertificate
	}
	opts := x509.VerifyOptions{
		Roots:         roots,
		Intermediates: x509.NewCertPool(),
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := certs[0].Verify(opts); err != nil {
		return fmt.Errorf("verify client certificate: %w", err)
	}
	return nil
}

// refusalReason is the metric label of a verifyChain error.
func refusalReason(err error) string {
	var unknown x509.UnknownAuthorityError
	var invalid x509.CertificateInvalidError
	switch {
	case errors.Is(err, errNoCertificate):
		return resultNoCertificate
	case errors.As(err, &unknown):
		return resultUnknownCA
	case errors.As(err, &invalid) && invalid.Reason == x509.Expired:
		return resultExpired
	}
	return resultBadCertificate
}

// Refusal log limit (see the package doc).
const (
	refusalLogBurst  = 20
	refusalLogWindow = 10 * time.Second
)

// refused logs a refusal at warning level, within the log limit.
func (s *Server) refused(msg string, attrs ...any) {
	ok, left := s.quiet.allow(s.now())
	if !ok {
		return
	}
	if left > 0 {
		attrs = append(attrs, "refusals_not_logged", left)
	}
	s.log.Warn(msg, attrs...)
}

// logLimit lets through burst lines per window and counts the others.
type logLimit struct {
	mu      sync.Mutex
	start   time.Time // of the current window
	n       int       // lines let through in it
	dropped int       // lines held back since the last one let through
}

// allow reports whether a line may be logged now and, if so, how many
// were held back before it.
func (l *logLimit) allow(now time.Time) (ok bool, dropped int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.start) >= refusalLogWindow {
		l.start, l.n = now, 0
	}
	if l.n >= refusalLogBurst {
		l.dropped++
		return false, 0
	}
	l.n++
	dropped, l.dropped = l.dropped, 0
	return true, dropped
}

// recheckLoop verifies the certificates of the live tunnels every
// s.recheck until ctx ends.
func (s *Server) recheckLoop(ctx context.Context) {
	t := time.NewTicker(s.recheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.recheckLive()
		}
	}
}

// recheckLive closes, with tunnel.CloseNotAllowed, every live tunnel
// whose certificate chain no longer verifies: it expired, or its CA left
// the client CAs. The edge then reconnects with the certificate it has now.
func (s *Server) recheckLive() {
	s.mu.Lock()
	live := slices.Collect(maps.Keys(s.live))
	s.mu.Unlock()
	pool, now := s.clientCAs(), s.now()
	for _, c := range live {
		certs := c.ConnectionState().TLS.PeerCertificates
		err := verifyChain(certs, pool, now)
		if err == nil {
			continue
		}
		reason := refusalReason(err)
		s.evictions.WithLabelValues(reason).Inc()
		attrs := []any{"remote", c.RemoteAddr().String(), "reason", reason, "err", err}
		if len(certs) > 0 {
			attrs = append(attrs, "subject", certs[0].Subject.String())
		}
		s.log.Warn("tunnel closed: its client certificate no longer verifies", attrs...)
		c.CloseWithError(tunnel.CloseNotAllowed, "client certificate no longer valid: "+reason)
	}
}
