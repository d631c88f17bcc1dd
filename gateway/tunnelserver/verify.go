package tunnelserver

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/internal/ticker"
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
			// hello.Context() is the connection's: it ends when the
			// handshake fails or the client goes silent.
			release, err := s.gate.enter(hello.Context())
			if err != nil {
				if errors.Is(err, errGateBusy) {
					s.shedHandshake(hello)
				}
				return nil, err
			}
			stop := func() bool { return false }
			if s.gate != nil {
				stop = context.AfterFunc(hello.Context(), func() {
					// Ended before its certificate came: abandoned,
					// unless the listener is closing.
					if !s.gate.isClosed() {
						s.handshakeAbandoned()
					}
					release()
				})
			}
			c := base.Clone()
			pool := clientCAs()
			c.ClientCAs = pool // only the hint of acceptable CAs in the CertificateRequest
			var remote string
			if hello.Conn != nil { // quic-go sets it
				remote = hello.Conn.RemoteAddr().String()
			}
			c.VerifyConnection = func(cs tls.ConnectionState) error {
				// The client's part of the work is done: what is left,
				// its Finished and the registration, is light.
				if stop() {
					s.flood.answered(s.now())
				}
				release()
				return s.verifyClient(cs.PeerCertificates, pool, remote)
			}
			return c, nil
		},
	}
}

// verifyClient checks a client's certificate chain as crypto/tls's
// RequireAndVerifyClientCert would, and logs and counts a refusal.
func (s *Server) verifyClient(certs []*x509.Certificate, roots *x509.CertPool, remote string) error {
	_, err := verifyChain(certs, roots, s.now())
	if err == nil {
		if node, nerr := tunnel.NodeName(certs[0]); nerr == nil && s.retired != nil && s.retired.Retired(node, certs[0]) {
			s.conns.WithLabelValues(resultRetired).Inc()
			s.refused("tunnel refused: the node's identity is retired (tetherctl node retire)", "node", node, "remote", remote,
				"reason", resultRetired, "cert_serial", certs[0].SerialNumber.Text(16), "cert_not_before", certs[0].NotBefore)
			return errRetired
		}
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

var (
	errNoCertificate = errors.New("no client certificate")
	errRetired       = errors.New("client certificate retired")
)

// verifyChain verifies the leaf certificate against roots, with the rest
// of certs as intermediates, for client authentication at time now. It
// returns when the verified chain stops verifying against these roots: the
// first NotAfter along it.
func verifyChain(certs []*x509.Certificate, roots *x509.CertPool, now time.Time) (until time.Time, err error) {
	if len(certs) == 0 {
		return time.Time{}, errNoCertificate
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
	chains, err := certs[0].Verify(opts)
	if err != nil {
		return time.Time{}, fmt.Errorf("verify client certificate: %w", err)
	}
	// Any chain will do; the one that lasts longest.
	for _, chain := range chains {
		first := chain[0].NotAfter
		for _, c := range chain[1:] {
			if c.NotAfter.Before(first) {
				first = c.NotAfter
			}
		}
		if first.After(until) {
			until = first
		}
	}
	return until, nil
}

// verifiedLeaves remembers, for the leaf certificate of each verified
// chain, the client CAs it was verified against and when it stops
// verifying, so that a recheck verifies only the chains whose CAs changed
// or whose time came: at 10,000 edges, verifying every chain every
// minute cost 8 % of an idle gateway's CPU. Keys are the parsed leaves
// crypto/tls keeps in each connection's state, so a tunnel's entry is
// found by pointer. Only recheckLive fills it, with live tunnels, and
// drops the rest: a handshake adds nothing, so a client that connects
// and is refused, or reconnects in a loop, pins no certificate here (a
// tunnel's chain is verified once more at its first recheck).
type verifiedLeaves struct {
	mu sync.Mutex
	m  map[*x509.Certificate]verifiedLeaf
}

type verifiedLeaf struct {
	roots *x509.CertPool
	until time.Time
}

func (v *verifiedLeaves) note(leaf *x509.Certificate, roots *x509.CertPool, until time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.m == nil {
		v.m = map[*x509.Certificate]verifiedLeaf{}
	}
	v.m[leaf] = verifiedLeaf{roots, until}
}

// stillGood reports whether leaf was verified against roots and now is
// before its chain's first NotAfter.
func (v *verifiedLeaves) stillGood(leaf *x509.Certificate, roots *x509.CertPool, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	e, ok := v.m[leaf]
	return ok && e.roots == roots && now.Before(e.until)
}

// keep forgets every leaf but those of leaves.
func (v *verifiedLeaves) keep(leaves map[*x509.Certificate]bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	maps.DeleteFunc(v.m, func(l *x509.Certificate, _ verifiedLeaf) bool { return !leaves[l] })
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

// shedHandshake counts a handshake the gate refused and logs it, at most
// one line per refusalLogWindow: a saturated gateway refuses hundreds a
// second.
func (s *Server) shedHandshake(hello *tls.ClientHelloInfo) {
	s.shed.Inc()
	ok, left := s.quietShed.allow(s.now())
	if !ok {
		return
	}
	in, waiting := s.gate.counts()
	attrs := []any{"in_progress", in, "waiting", waiting, "max_handshakes", s.gate.max, "waited", s.gate.maxWait}
	if hello.Conn != nil {
		attrs = append(attrs, "remote", hello.Conn.RemoteAddr().String())
	}
	if left > 0 {
		attrs = append(attrs, "refusals_not_logged", left)
	}
	s.log.Warn(ShedMessage, attrs...)
}

// ShedMessage is the log line of handshakes refused as busy.
const ShedMessage = "tunnel handshake refused: gateway busy; the edge dials again in 2 to 8 s (tether_gateway_tunnel_handshakes_shed_total; docs/sizing.md)"

// logLimit lets through burst lines per window (refusalLogBurst if 0) and
// counts the others.
type logLimit struct {
	burst   int
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
	if l.n >= cmp.Or(l.burst, refusalLogBurst) {
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
	ticker.Every(ctx, nil, s.recheck, func() bool {
		s.recheckLive()
		return true
	})
}

// recheckLive closes, with tunnel.CloseNotAllowed, every live tunnel
// whose certificate chain no longer verifies: it expired, or its CA left
// the client CAs. The edge then reconnects with the certificate it has now.
func (s *Server) recheckLive() {
	s.mu.Lock()
	live := slices.Collect(maps.Keys(s.live))
	s.mu.Unlock()
	pool, now := s.clientCAs(), s.now()
	leaves := make(map[*x509.Certificate]bool, len(live))
	for _, c := range live {
		certs := c.ConnectionState().TLS.PeerCertificates
		if len(certs) > 0 {
			leaves[certs[0]] = true
			if s.verified.stillGood(certs[0], pool, now) {
				continue
			}
		}
		until, err := verifyChain(certs, pool, now)
		if err == nil {
			s.verified.note(certs[0], pool, until)
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
	s.verified.keep(leaves)
}

// isRetired reports whether conn's certificate is retired now.
func (s *Server) isRetired(conn *quic.Conn) bool {
	if s.retired == nil {
		return false
	}
	certs := conn.ConnectionState().TLS.PeerCertificates
	if len(certs) == 0 {
		return false
	}
	node, err := tunnel.NodeName(certs[0])
	return err == nil && s.retired.Retired(node, certs[0])
}

// CloseRetired closes, with tunnel.CloseNotAllowed, every live tunnel
// whose certificate is retired now. The gateway calls it when the retired
// set changes.
func (s *Server) CloseRetired() {
	if s.retired == nil {
		return
	}
	s.mu.Lock()
	live := slices.Collect(maps.Keys(s.live))
	s.mu.Unlock()
	for _, c := range live {
		if s.isRetired(c) {
			node, _ := tunnel.NodeName(c.ConnectionState().TLS.PeerCertificates[0])
			s.evict(c, node, c.RemoteAddr().String())
		}
	}
}

// evict closes the tunnel of a retired certificate, once.
func (s *Server) evict(c *quic.Conn, node, remote string) {
	if c.Context().Err() != nil {
		return
	}
	s.evictions.WithLabelValues(resultRetired).Inc()
	s.log.Warn("tunnel closed: the node's identity is retired (tetherctl node retire)", "node", node, "remote", remote)
	c.CloseWithError(tunnel.CloseNotAllowed, "node identity retired")
}
