// Package tunnelserver is the gateway's QUIC listener: edges dial it, it
// checks that each client certificate names a node, and it keeps each
// accepted connection in the edge registry for as long as it lives.
//
// TLS verifies the client certificate's chain against the client CA during
// the handshake (tunnel.ServerTLS), so a certificate from another CA, or
// none, never gets a connection. A verified certificate that is not a node
// identity (tunnel.NodeName) is closed right after the handshake with
// tunnel.CloseNotAllowed and counted.
//
// Edges may not open streams toward the gateway (MaxIncomingStreams is
// negative): every stream is opened by the gateway, one per proxied TCP
// connection.
//
// Shutdown, when Serve's context ends: stop accepting, let the open streams
// finish for up to Options.ShutdownGrace, then close every connection with
// tunnel.CloseShutdown so that the edges move to the other replicas at once
// instead of waiting for an idle timeout.
package tunnelserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/gateway/registry"
	"github.com/tether-edge/tether/tunnel"
)

// DefaultShutdownGrace is how long Serve lets streams drain by default.
const DefaultShutdownGrace = 10 * time.Second

// Options configure a Server.
type Options struct {
	// GetCertificate returns the gateway's serving certificate; it may
	// rotate.
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// ClientCAs verify the edges' client certificates (--client-ca).
	ClientCAs *x509.CertPool
	// StatelessResetKey, stable across restarts (tunnel.StatelessResetKey),
	// lets a restarted gateway reset the edges' stale connections at once.
	StatelessResetKey *quic.StatelessResetKey
	// Limits: IdleTimeout applies to every tunnel; the per-edge stream limit
	// is the registry's.
	Limits tunnel.Limits
	// ShutdownGrace bounds how long open streams may drain at shutdown; 0
	// means DefaultShutdownGrace.
	ShutdownGrace time.Duration
	// Logger receives connection logs; nil discards them.
	Logger *slog.Logger
	// Registerer, if set, gets tether_gateway_tunnel_connections_total.
	Registerer prometheus.Registerer
}

// Server accepts edge tunnels into a registry.
type Server struct {
	reg   *registry.Registry
	tr    *quic.Transport
	ln    *quic.Listener
	grace time.Duration
	log   *slog.Logger
	conns *prometheus.CounterVec

	wg     sync.WaitGroup // connection handlers
	mu     sync.Mutex
	live   map[*quic.Conn]struct{} // guarded by mu: accepted, not yet closed
	closed bool                    // guarded by mu: shutting down
}

// Connection results counted by tether_gateway_tunnel_connections_total.
const (
	resultRegistered = "registered"
	resultNotANode   = "not_a_node"
)

// Listen binds the UDP address (such as ":10262") and starts accepting QUIC
// handshakes; Serve hands the connections to the registry.
func Listen(addr string, reg *registry.Registry, opts Options) (*Server, error) {
	if opts.GetCertificate == nil || opts.ClientCAs == nil {
		return nil, errors.New("tunnel listener: serving certificate and client CA are required")
	}
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("tunnel listener %s: %w", addr, err)
	}
	uc, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, fmt.Errorf("tunnel listener: %w", err)
	}
	// A Transport of our own, rather than quic.ListenAddr, so that closing
	// the listener stops new handshakes but leaves established tunnels up
	// while they drain.
	tr := &quic.Transport{Conn: uc, StatelessResetKey: opts.StatelessResetKey}
	cfg := tunnel.QUICConfig(opts.Limits)
	cfg.MaxIncomingStreams = -1 // the gateway opens every stream
	ln, err := tr.Listen(tunnel.ServerTLS(opts.GetCertificate, opts.ClientCAs), cfg)
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("tunnel listener %s: %w", addr, err)
	}
	s := &Server{
		reg:   reg,
		tr:    tr,
		ln:    ln,
		grace: opts.ShutdownGrace,
		log:   opts.Logger,
		live:  make(map[*quic.Conn]struct{}),
		conns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_gateway_tunnel_connections_total",
			Help: "Tunnel connections that completed the TLS handshake, by result: registered, or not_a_node (verified certificate that names no node; closed).",
		}, []string{"result"}),
	}
	if s.grace <= 0 {
		s.grace = DefaultShutdownGrace
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	for _, r := range []string{resultRegistered, resultNotANode} {
		s.conns.WithLabelValues(r)
	}
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(s.conns); err != nil {
			tr.Close()
			return nil, fmt.Errorf("register tunnel metrics: %w", err)
		}
	}
	return s, nil
}

// Addr is the UDP address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close releases the socket of a server whose Serve was never called
// (Serve closes it itself).
func (s *Server) Close() error {
	s.ln.Close()
	return s.tr.Close()
}

// Serve accepts tunnels until ctx is done, then shuts down gracefully (see
// the package doc) and returns nil. It closes the listening socket before
// it returns.
func (s *Server) Serve(ctx context.Context) error {
	s.log.Info("tunnel listener up", "addr", s.ln.Addr().String())
	var err error
	for {
		var conn *quic.Conn
		conn, err = s.ln.Accept(ctx)
		if err != nil {
			break
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handle(conn)
		}()
	}
	if ctx.Err() == nil {
		err = fmt.Errorf("accept tunnel: %w", err)
	} else {
		err = nil
	}
	s.shutdown()
	return err
}

func (s *Server) handle(conn *quic.Conn) {
	if !s.track(conn) {
		conn.CloseWithError(tunnel.CloseShutdown, "gateway shutting down")
		return
	}
	defer s.untrack(conn)
	remote := conn.RemoteAddr().String()
	e, err := s.reg.Register(conn)
	if err != nil {
		s.conns.WithLabelValues(resultNotANode).Inc()
		s.log.Warn("tunnel refused: client certificate names no node", "remote", remote, "err", err)
		conn.CloseWithError(tunnel.CloseNotAllowed, "client certificate is not a node identity")
		return
	}
	s.conns.WithLabelValues(resultRegistered).Inc()
	log := s.log.With("node", e.Node(), "remote", remote)
	log.Info("edge connected")
	<-conn.Context().Done()
	s.reg.Unregister(e)
	log.Info("edge disconnected", "reason", context.Cause(conn.Context()))
}

func (s *Server) shutdown() {
	s.ln.Close()
	if n := s.reg.Len(); n > 0 {
		s.log.Info("tunnel listener closed; draining streams", "edges", n, "grace", s.grace)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.grace)
	if err := s.reg.Drain(ctx); err != nil {
		s.log.Warn("closing tunnels with streams still open", "err", err)
	}
	cancel()
	s.mu.Lock()
	s.closed = true
	live := slices.Collect(maps.Keys(s.live))
	s.mu.Unlock()
	for _, c := range live {
		c.CloseWithError(tunnel.CloseShutdown, "gateway shutting down")
	}
	s.wg.Wait()
	s.tr.Close()
	s.log.Info("tunnel listener stopped")
}

// track adds conn to the live set unless the server is shutting down.
func (s *Server) track(conn *quic.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.live[conn] = struct{}{}
	return true
}

func (s *Server) untrack(conn *quic.Conn) {
	s.mu.Lock()
	delete(s.live, conn)
	s.mu.Unlock()
}
