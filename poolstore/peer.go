package poolstore

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"

	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/tunnel"
)

// DefaultPort is the pool listener's port.
const DefaultPort = 10269

// Members is this node's view of the pool members, from the Node objects
// the edge caches. Methods must not block.
type Members interface {
	// Pool is the pool node belongs to; ok is false for an unknown node
	// or one in no pool.
	Pool(node string) (pool string, ok bool)
	// Address is where node's pool listener is: a host (the default port
	// is added) or host:port.
	Address(node string) (addr string, ok bool)
}

// PeerConfig is what the pool listener's server and clients share: this
// node's identity and credentials and the pool's membership.
type PeerConfig struct {
	// Self is this node's name, as its certificate names it.
	Self string
	// Certificate returns this node's certificate (CN=system:node:<Self>,
	// O=system:nodes), presented both as server and as client; it is
	// called at each handshake, so a rotated certificate is used for the
	// next connection (certfile.KeyPair.Certificate).
	Certificate func() (*tls.Certificate, error)
	// CAs returns the pool of CAs that sign node certificates, at each
	// handshake (certfile.CAs.Pool). It must not return nil.
	CAs func() *x509.CertPool
	// Members says who belongs to which pool.
	Members Members
	// Port is the peers' pool listener port when Members gives no port.
	// Default DefaultPort.
	Port int

	Clock  clock.WithTicker // default the real clock
	Logger *slog.Logger     // default discard
}

func (c PeerConfig) withDefaults() (PeerConfig, error) {
	if c.Self == "" || c.Certificate == nil || c.CAs == nil || c.Members == nil {
		return c, errors.New("pool peer: Self, Certificate, CAs and Members are required")
	}
	if c.Port <= 0 {
		c.Port = DefaultPort
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// addr is the host:port to dial for node.
func (c PeerConfig) addr(node string) (string, error) {
	a, ok := c.Members.Address(node)
	if !ok || a == "" {
		return "", fmt.Errorf("no address known for node %s", node)
	}
	if _, _, err := net.SplitHostPort(a); err == nil {
		return a, nil
	}
	return net.JoinHostPort(a, strconv.Itoa(c.Port)), nil
}

// Reasons a peer is refused, the "reason" label of
// tether_edge_pool_peers_refused_total. The first three end the TLS
// handshake; the others are answered 403.
const (
	refusedNoCertificate  = "no_certificate"  // the peer sent none
	refusedBadCertificate = "bad_certificate" // not signed by the CAs, expired
	refusedNotANode       = "not_a_node"      // not CN=system:node:<name>, O=system:nodes
	refusedUnknownNode    = "unknown_node"    // Members does not know its pool
	refusedOtherPool      = "other_pool"      // it belongs to another pool
	refusedNoPool         = "no_pool"         // this node's own pool is unknown
)

var refusalReasons = []string{refusedNoCertificate, refusedBadCertificate, refusedNotANode,
	refusedUnknownNode, refusedOtherPool, refusedNoPool}

// refusal is a refused peer: why (one of the reasons above) and what.
type refusal struct {
	reason string
	err    error
}

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

// verifyNode checks a peer's certificate chain against the CAs, for any
// extended key usage (a kubelet's client certificate often has only
// clientAuth, and serves here as a server certificate too), and returns
// the node it names.
func verifyNode(chain []*x509.Certificate, cas *x509.CertPool, c clock.PassiveClock) (string, error) {
	if len(chain) == 0 {
		return "", &refusal{refusedNoCertificate, errors.New("peer sent no certificate")}
	}
	if cas == nil { // x509 would fall back to the system roots
		return "", &refusal{refusedBadCertificate, errors.New("no CAs to verify the peer's certificate")}
	}
	inter := x509.NewCertPool()
	for _, ic := range chain[1:] {
		inter.AddCert(ic)
	}
	opts := x509.VerifyOptions{Roots: cas, Intermediates: inter, CurrentTime: c.Now(),
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
	if _, err := chain[0].Verify(opts); err != nil {
		return "", &refusal{refusedBadCertificate, fmt.Errorf("verify peer certificate %q: %w", chain[0].Subject.CommonName, err)}
	}
	node, err := tunnel.NodeName(chain[0])
	if err != nil {
		return "", &refusal{refusedNotANode, err}
	}
	return node, nil
}

// serverTLS is the pool listener's TLS configuration: TLS 1.3, HTTP/2
// only, this node's certificate, and the peer's certificate required and
// verified by verifyNode (the membership check comes after, per request).
// refused is told of every peer refused during the handshake.
func (c PeerConfig) serverTLS(refused func(remote net.Addr, err error)) *tls.Config {
	base := &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{"h2"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return c.Certificate()
		},
		// Request rather than RequireAny: a peer without a certificate
		// then reaches VerifyConnection, which counts it and fails the
		// handshake all the same.
		ClientAuth: tls.RequestClientCert,
	}
	// A configuration per connection, so that a refusal names the peer.
	base.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		cfg := base.Clone()
		cfg.GetConfigForClient = nil
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			_, err := verifyNode(cs.PeerCertificates, c.CAs(), c.Clock)
			if err != nil {
				refused(hello.Conn.RemoteAddr(), err)
			}
			return err
		}
		return cfg, nil
	}
	return base
}

// clientTLS is the configuration that dials peers: TLS 1.3, HTTP/2, this
// node's certificate, and the server's certificate verified by verifyNode
// and required to name the node dialled, which the transport puts in
// ServerName (the URL's host is the node's name; see Client).
func (c PeerConfig) clientTLS() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{"h2"},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return c.Certificate()
		},
		InsecureSkipVerify: true, // verified below, against CAs, for the node expected
		VerifyConnection: func(cs tls.ConnectionState) error {
			node, err := verifyNode(cs.PeerCertificates, c.CAs(), c.Clock)
			if err != nil {
				return err
			}
			if node != cs.ServerName {
				return fmt.Errorf("peer at this address is node %s, not %s", node, cs.ServerName)
			}
			return nil
		},
	}
}
