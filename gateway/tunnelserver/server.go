// Package tunnelserver is the gateway's QUIC listener: edges dial it, it
// checks that each client certificate names a node, and it keeps each
// accepted connection in the edge registry for as long as it lives.
//
// The client certificate's chain is verified against the client CAs during
// the handshake, so a certificate from another CA, an expired one, or none,
// never gets a connection. The server verifies it itself (VerifyConnection,
// with the same checks crypto/tls makes) rather than leaving it to
// crypto/tls, for two reasons: the CAs are asked for on every handshake
// (Options.GetClientCAs, a --client-ca file that may be rotated), and each
// refusal is logged with its reason and the peer's address, and counted.
// The peer then sees a bad_certificate alert whatever the reason; the
// gateway's log and metrics say which. A verified certificate that is not a
// node identity (tunnel.NodeName) is closed right after the handshake with
// tunnel.CloseNotAllowed and counted. Session tickets are off, so every
// connection presents its certificate and is verified against the CAs of
// the moment.
//
// A certificate is good for the handshake only, but tunnels live for
// weeks: every Options.RecheckInterval the chains of the live tunnels are
// verified again, against the client CAs and the time of the moment (a
// chain is verified again only once the client CAs changed or a NotAfter
// along it passed), and a tunnel whose certificate expired or whose CA
// left --client-ca is closed
// with tunnel.CloseNotAllowed (counted by
// tether_gateway_tunnel_evictions_total). The edge reconnects with the
// certificate it holds now, if that one verifies.
//
// At most Options.MaxHandshakes handshakes are in progress at once, from
// the ClientHello until the client's certificate is checked; the others
// wait, the newest let in first, and one that waited handshakeMaxWait is
// refused (see handshakeGate). While half the places are held and
// handshakes were abandoned in numbers lately, as in a flood from forged
// addresses, new clients are sent a QUIC Retry and must answer it from
// their address before their handshake counts (see retry.go).
//
// Refusal log lines are limited (a handshake flood must not become a log
// flood): at most refusalLogBurst per refusalLogWindow, the rest counted
// only, with the number left out reported on the next line.
//
// A retired node identity (Options.Retired; internal/retired) gets no
// tunnel: its certificate is refused once verified, counted with the
// result "retired", and CloseRetired, called when the retired set
// changes, closes the live tunnels of the certificates it now retires with
// tunnel.CloseNotAllowed (tether_gateway_tunnel_evictions_total, reason
// "retired"). A stream the edge opens is checked again before it is
// served, so no election record or delegated heartbeat is written for a
// retired certificate in the moment before its tunnel closes.
//
// The gateway opens one stream per proxied TCP connection. An edge may
// open streams of five kinds only, liveness probes (always answered OK:
// see the tunnel package doc), delegated heartbeats (when
// Options.Heartbeats is set), election record writes (when
// Options.Elections is), pool feeds (when Options.PoolFeeds is) and
// edge pods' connections to cloud Services (when Options.Services is):
// at most tunnel.MaxStreamsToGateway at once, Options.ServiceStreams more
// with Services (QUIC's MaxIncomingStreams).
// Each must bring its request (tunnel.ReadEdgeRequest) within
// edgeRequestTimeout; a malformed one, or one of a kind no handler
// serves, is answered with tunnel.BadRequest. The handler is told the
// sender from the connection's verified certificate, never from the
// request, and its reply is sent back. A pool feed is not bounded by
// edgeHandleTimeout: after its reply the feed flows for as long as the
// handler serves it (while the sender leads its pool), and holds one of
// the edge's streams all that time; each write must go through within
// poolFeedWriteTimeout, and the edge ends it by cancelling the stream.
//
// Shutdown, when Serve's context ends: stop accepting, let the open streams
// finish for up to Options.ShutdownGrace, then close every connection with
// tunnel.CloseShutdown so that the edges move to the other replicas at once
// instead of waiting for an idle timeout.
package tunnelserver

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
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

// DefaultRecheckInterval is how often live tunnels' certificates are
// verified again by default.
const DefaultRecheckInterval = time.Minute

// Options configure a Server.
type Options struct {
	// GetCertificate returns the gateway's serving certificate; it may
	// rotate.
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// ClientCAs verify the edges' client certificates (--client-ca).
	ClientCAs *x509.CertPool
	// GetClientCAs, if set, is asked for the client CAs on every
	// handshake instead of ClientCAs (they may rotate).
	GetClientCAs func() *x509.CertPool
	// StatelessResetKey, stable across restarts (tunnel.StatelessResetKey),
	// lets a restarted gateway reset the edges' stale connections at once.
	StatelessResetKey *quic.StatelessResetKey
	// Limits: IdleTimeout and ReceiveBudget apply to every tunnel; the
	// per-edge stream limit is the registry's.
	Limits tunnel.Limits
	// UDPBuffer, if positive, is the size in bytes of the listening
	// socket's receive and send buffers (--udp-buffer; see setUDPBuffers);
	// 0 leaves quic-go's choice (it asks for 7 MiB).
	UDPBuffer int
	// ShutdownGrace bounds how long open streams may drain at shutdown; 0
	// means DefaultShutdownGrace.
	ShutdownGrace time.Duration
	// Logger receives connection logs; nil discards them.
	Logger *slog.Logger
	// Registerer, if set, gets tether_gateway_tunnel_connections_total and
	// the others, with the receive budget's when Limits has one.
	Registerer prometheus.Registerer
	// Now is the clock certificates are verified with; nil means time.Now.
	Now func() time.Time
	// RecheckInterval is how often the certificates of live tunnels are
	// verified again (see the package doc); 0 means DefaultRecheckInterval.
	RecheckInterval time.Duration
	// MaxHandshakes bounds the TLS handshakes in progress at once
	// (--max-handshakes; see handshakeGate); 0 means no bound.
	MaxHandshakes int
	// handshakeWait replaces handshakeMaxWait in tests.
	handshakeWait time.Duration
	// floodThreshold replaces the abandoned handshakes per floodWindow
	// that mean a flood (MaxHandshakes/8, at least 8) in tests.
	floodThreshold int
	// Heartbeats, if set, answers the delegate-heartbeat streams edges
	// open, and Elections their election record writes; without either
	// edges may open no stream.
	Heartbeats Heartbeats
	Elections  Elections
	// PoolFeeds, if set, serves the pools' signed feeds to their leaders.
	PoolFeeds PoolFeeds
	// Services, if set, connects edge pods to marked cloud Services; an
	// edge may then open ServiceStreams streams more, and a relayed one
	// ends after StreamIdle without a byte either way (0: never).
	Services       Services
	ServiceStreams int
	StreamIdle     time.Duration
	// Retired, if set, says which node certificates are retired (see the
	// package doc).
	Retired Retired
}

// Retired says whether a node's certificate is retired
// (internal/retired.Watcher).
type Retired interface {
	// Retired reports whether cert, a certificate of node, is retired.
	// It must not block.
	Retired(node string, cert *x509.Certificate) bool
}

// Heartbeats answers delegated heartbeats (package gateway/heartbeat).
type Heartbeats interface {
	// Delegate answers req from sender, the node named by the edge's
	// verified client certificate: OK once the Lease is written, or a
	// refusal. ctx ends when the stream's time is up or the tunnel closes.
	Delegate(ctx context.Context, sender string, req tunnel.DelegateRequest) tunnel.Reply
}

// Elections writes pool election records for edges (package
// gateway/election).
type Elections interface {
	// Elect answers req from sender, the node named by the edge's
	// verified client certificate: OK with the record as stored, or a
	// refusal. ctx ends when the stream's time is up or the tunnel closes.
	Elect(ctx context.Context, sender string, req tunnel.ElectionRequest) tunnel.ElectionReply
}

// PoolFeeds serves the pools' signed feeds to their leaders (package
// gateway/poolfeed).
type PoolFeeds interface {
	// ServePoolFeed answers req from sender, the node named by the edge's
	// verified client certificate: it calls reply once, with a refusal
	// (and then returns) or with OK, after which it writes the feed to w
	// until ctx ends, the sender no longer leads its pool or a write
	// fails. ctx ends when the edge cancels the stream or the tunnel
	// closes.
	ServePoolFeed(ctx context.Context, sender string, req tunnel.PoolFeedRequest, w io.Writer, reply func(tunnel.Reply) error) error
}

// Services connects edge pods to the cloud Services marked for them
// (package gateway/edgeservices).
type Services interface {
	// Connect answers req from sender, the node named by the edge's
	// verified client certificate: a connection to an endpoint and an OK
	// reply, or no connection and a refusal. done, set with a connection,
	// is called once the relay ends.
	Connect(ctx context.Context, sender string, req tunnel.ServiceRequest) (conn net.Conn, rep tunnel.Reply, done func())
}

// poolFeedWriteTimeout bounds one write of a pool feed: a leader that
// reads nothing for that long is ended.
const poolFeedWriteTimeout = 30 * time.Second

// Bounds of a stream an edge opens: its request must arrive within
// edgeRequestTimeout, and the handler's answer within edgeHandleTimeout.
const (
	edgeRequestTimeout = 5 * time.Second
	edgeHandleTimeout  = 10 * time.Second
)

// Server accepts edge tunnels into a registry.
type Server struct {
	reg   *registry.Registry
	udp   *net.UDPConn // the listening socket; quic.Transport does not close it
	tr    *quic.Transport
	ln    *quic.Listener
	grace time.Duration
	log   *slog.Logger
	now   func() time.Time
	quiet logLimit // of refusal lines
	*metrics

	gate      *handshakeGate
	quietShed logLimit   // of its refusal lines
	flood     floodWatch // of abandoned handshakes: when to ask for Retry

	clientCAs func() *x509.CertPool
	recheck   time.Duration
	verified  verifiedLeaves // chains verified, and until when

	heartbeats Heartbeats
	elections  Elections
	poolFeeds  PoolFeeds
	services   Services
	streamIdle time.Duration
	retired    Retired

	wg     sync.WaitGroup // connection handlers
	mu     sync.Mutex
	live   map[*quic.Conn]struct{} // guarded by mu: accepted, not yet closed
	closed bool                    // guarded by mu: shutting down
}

// Connection results counted by tether_gateway_tunnel_connections_total.
// All but registered are refusals: not_a_node and too_often after the
// handshake, the others during it.
const (
	resultRegistered     = "registered"
	resultNotANode       = "not_a_node"      // verified certificate that names no node
	resultTooOften       = "too_often"       // would replace the node's registration, replaced too often lately
	resultNoCertificate  = "no_certificate"  // the peer sent none
	resultUnknownCA      = "unknown_ca"      // not signed by a client CA
	resultExpired        = "expired"         // outside its validity period
	resultBadCertificate = "bad_certificate" // any other verification failure (key usage, ...)
	resultRetired        = "retired"         // a node certificate the operator retired (also an eviction reason)
)

var results = []string{resultRegistered, resultNotANode, resultTooOften, resultNoCertificate, resultUnknownCA, resultExpired, resultBadCertificate, resultRetired}

// Results of the streams edges open, counted by
// tether_gateway_tunnel_edge_streams_total.
const (
	streamServed     = "served"      // the request was handed to the handler, its reply sent
	streamProbe      = "probe"       // a liveness probe, answered
	streamBadRequest = "bad_request" // malformed, of another kind or version, or not sent in time
	streamAborted    = "aborted"     // the stream or the tunnel ended before the request
)

// Listen binds the UDP address (such as ":10262") and starts accepting QUIC
// handshakes; Serve hands the connections to the registry.
func Listen(addr string, reg *registry.Registry, opts Options) (*Server, error) {
	if opts.GetCertificate == nil || (opts.ClientCAs == nil && opts.GetClientCAs == nil) {
		return nil, errors.New("tunnel listener: serving certificate and client CA are required")
	}
	clientCAs := opts.GetClientCAs
	if clientCAs == nil {
		clientCAs = func() *x509.CertPool { return opts.ClientCAs }
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
	cfg := tunnel.ListenerQUICConfig(opts.Limits)
	// The gateway opens every stream but the edges' requests: liveness
	// probes, delegated heartbeats, election record writes and pool
	// feeds.
	cfg.MaxIncomingStreams = tunnel.MaxStreamsToGateway
	if opts.Services != nil {
		// And the edge pods' connections to cloud Services.
		cfg.MaxIncomingStreams += int64(max(opts.ServiceStreams, 0))
	}
	s := &Server{
		reg:   reg,
		udp:   uc,
		tr:    tr,
		grace: opts.ShutdownGrace,
		log:   opts.Logger,
		now:   opts.Now,
		live:  make(map[*quic.Conn]struct{}),

		gate:      newHandshakeGate(opts.MaxHandshakes, cmp.Or(opts.handshakeWait, handshakeMaxWait)),
		quietShed: logLimit{burst: 1},
		flood:     floodWatch{threshold: cmp.Or(opts.floodThreshold, max(opts.MaxHandshakes/8, 8))},

		clientCAs:  clientCAs,
		recheck:    opts.RecheckInterval,
		heartbeats: opts.Heartbeats,
		elections:  opts.Elections,
		poolFeeds:  opts.PoolFeeds,
		services:   opts.Services,
		streamIdle: opts.StreamIdle,
		retired:    opts.Retired,
	}
	if s.grace <= 0 {
		s.grace = DefaultShutdownGrace
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.recheck <= 0 {
		s.recheck = DefaultRecheckInterval
	}
	if s.metrics, err = newMetrics(opts.Registerer, s, opts.Limits.ReceiveBudget); err != nil {
		uc.Close()
		return nil, fmt.Errorf("register tunnel metrics: %w", err)
	}
	if s.gate != nil {
		tr.VerifySourceAddress = s.verifySourceAddress
	}
	s.ln, err = tr.Listen(s.tlsConfig(opts.GetCertificate, clientCAs), cfg)
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("tunnel listener %s: %w", addr, err)
	}
	if opts.UDPBuffer > 0 {
		// After tr.Listen: quic-go sets its own size when it wraps the
		// socket.
		s.sizeBuffers(opts.UDPBuffer)
	}
	return s, nil
}

// handshakeMaxWait is how long a handshake waits for a place in the gate
// before it is refused: less than the edges' handshake timeout
// (tunnel.QUICConfig's HandshakeIdleTimeout, 5 s), so that one let in
// late still answers its client in time, and so that a client that gave
// up is not let in.
const handshakeMaxWait = 3 * time.Second

// Addr is the UDP address the server listens on.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close releases the socket of a server whose Serve was never called
// (Serve closes it itself).
func (s *Server) Close() error {
	s.gate.close()
	s.ln.Close()
	s.tr.Close()
	return s.udp.Close()
}

// Serve accepts tunnels until ctx is done, then shuts down gracefully (see
// the package doc) and returns nil. It closes the listening socket before
// it returns.
func (s *Server) Serve(ctx context.Context) error {
	s.log.Info("tunnel listener up", "addr", s.ln.Addr().String())
	recheckDone := make(chan struct{})
	go func() {
		defer close(recheckDone)
		s.recheckLoop(ctx)
	}()
	defer func() { <-recheckDone }()
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
	if s.isRetired(conn) {
		// Retired between its handshake and track: CloseRetired may have
		// missed it.
		node, _ := tunnel.NodeName(conn.ConnectionState().TLS.PeerCertificates[0])
		s.evict(conn, node, remote)
		return
	}
	e, err := s.reg.Register(conn)
	if errors.Is(err, registry.ErrReplacedTooOften) {
		// The registry logged it, at most once a minute for the node. The
		// edge reads CloseReplaced as another machine using its
		// certificate, and backs off.
		s.conns.WithLabelValues(resultTooOften).Inc()
		conn.CloseWithError(tunnel.CloseReplaced, "node re-registered too often; its current connection is kept")
		return
	}
	if err != nil {
		s.conns.WithLabelValues(resultNotANode).Inc()
		s.refused("tunnel refused: client certificate names no node", "remote", remote, "reason", resultNotANode, "err", err)
		conn.CloseWithError(tunnel.CloseNotAllowed, "client certificate is not a node identity")
		return
	}
	s.conns.WithLabelValues(resultRegistered).Inc()
	log := s.log.With("node", e.Node(), "remote", remote)
	cert := conn.ConnectionState().TLS.PeerCertificates[0] // Register found it
	log.Info("edge connected", "cert_serial", cert.SerialNumber.Text(16), "cert_not_after", cert.NotAfter)
	s.serveEdgeStreams(conn, e.Node(), remote, log)
	<-conn.Context().Done()
	s.reg.Unregister(e)
	log.Info("edge disconnected", "reason", context.Cause(conn.Context()))
}

func (s *Server) shutdown() {
	s.gate.close()
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
	s.udp.Close()
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

// serveEdgeStreams serves the streams the edge of node opens until its
// connection ends, and returns once each of them is done.
func (s *Server) serveEdgeStreams(conn *quic.Conn, node, remote string, log *slog.Logger) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		qs, err := conn.AcceptStream(conn.Context())
		if err != nil {
			return
		}
		if s.isRetired(conn) {
			// Retired since the handshake: CloseRetired is closing it.
			s.evict(conn, node, remote)
			return
		}
		wg.Go(func() { s.serveEdgeStream(conn.Context(), qs, node, remote, log) })
	}
}

// serveEdgeStream reads one request, hands it to its handler with the
// sender's node name and writes the handler's reply.
func (s *Server) serveEdgeStream(ctx context.Context, qs *quic.Stream, node, remote string, log *slog.Logger) {
	qs.SetReadDeadline(time.Now().Add(edgeRequestTimeout))
	req, err := tunnel.ReadEdgeRequest(qs)
	if err == nil && ((req.Delegate != nil && s.heartbeats == nil) || (req.Election != nil && s.elections == nil) ||
		(req.PoolFeed != nil && s.poolFeeds == nil) || (req.Service != nil && s.services == nil)) {
		err = fmt.Errorf("%w: this gateway serves no such request", tunnel.ErrBadHeader)
	}
	if err != nil {
		if !errors.Is(err, tunnel.ErrBadHeader) && !errors.Is(err, os.ErrDeadlineExceeded) {
			s.edgeStreams.WithLabelValues(streamAborted).Inc()
			log.Debug("edge stream ended before its request", "err", err)
			qs.CancelRead(0)
			qs.CancelWrite(0)
			return
		}
		s.edgeStreams.WithLabelValues(streamBadRequest).Inc()
		s.refused("edge stream refused: bad request", "node", node, "remote", remote, "err", err)
		rep := tunnel.Reply{Code: tunnel.BadRequest, Message: err.Error()}
		s.reply(qs, func(w io.Writer) error { return tunnel.WriteReply(w, rep) }, log)
		return
	}
	if req.Probe {
		s.edgeStreams.WithLabelValues(streamProbe).Inc()
		s.reply(qs, func(w io.Writer) error { return tunnel.WriteReply(w, tunnel.Reply{Code: tunnel.OK}) }, log)
		return
	}
	s.edgeStreams.WithLabelValues(streamServed).Inc()
	if req.PoolFeed != nil {
		s.servePoolFeed(ctx, qs, node, *req.PoolFeed, log)
		return
	}
	if req.Service != nil {
		s.serveService(ctx, qs, node, *req.Service, log)
		return
	}
	hctx, cancel := context.WithTimeout(ctx, edgeHandleTimeout)
	defer cancel()
	if req.Delegate != nil {
		rep := s.heartbeats.Delegate(hctx, node, *req.Delegate)
		s.reply(qs, func(w io.Writer) error { return tunnel.WriteReply(w, rep) }, log)
		return
	}
	rep := s.elections.Elect(hctx, node, *req.Election)
	s.reply(qs, func(w io.Writer) error { return tunnel.WriteElectionReply(w, rep) }, log)
}

// servePoolFeed hands a pool feed request to the handler, which replies
// and then writes the feed, each write within poolFeedWriteTimeout. The
// edge sends nothing after its request: anything but the end of its side
// (a reset) ends the feed, as the tunnel's end does.
func (s *Server) servePoolFeed(ctx context.Context, qs *quic.Stream, node string, req tunnel.PoolFeedRequest, log *slog.Logger) {
	qs.SetReadDeadline(time.Time{})
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		_, err := io.Copy(io.Discard, qs)
		if err == nil {
			return // the edge's FIN after its request
		}
		cancel(fmt.Errorf("edge ended its pool feed stream: %w", err))
	}()
	// The stream's context ends when the edge stops reading (STOP_SENDING).
	stopped := context.AfterFunc(qs.Context(), func() { cancel(errors.New("edge stopped reading its pool feed")) })
	defer stopped()
	stop := context.AfterFunc(ctx, func() { qs.CancelWrite(0) })
	defer stop()
	replied := false
	err := s.poolFeeds.ServePoolFeed(ctx, node, req, deadlineWriter{qs}, func(r tunnel.Reply) error {
		replied = true
		qs.SetWriteDeadline(time.Now().Add(edgeRequestTimeout))
		return tunnel.WriteReply(qs, r)
	})
	switch {
	case !replied:
		rep := tunnel.Reply{Code: tunnel.Unavailable, Message: fmt.Sprintf("pool feed not served: %v", err)}
		s.reply(qs, func(w io.Writer) error { return tunnel.WriteReply(w, rep) }, log)
		return
	case err != nil && ctx.Err() == nil:
		log.Debug("pool feed ended", "pool", req.Pool, "err", err)
		qs.CancelWrite(0)
	default:
		qs.Close()
	}
	qs.CancelRead(0)
}

// serveService connects an edge pod to a cloud Service and relays; the
// dial is bounded by edgeHandleTimeout, the relay by the stream idle
// timeout.
func (s *Server) serveService(ctx context.Context, qs *quic.Stream, node string, req tunnel.ServiceRequest, log *slog.Logger) {
	hctx, cancel := context.WithTimeout(ctx, edgeHandleTimeout)
	conn, rep, done := s.services.Connect(hctx, node, req)
	cancel()
	if conn == nil {
		s.reply(qs, func(w io.Writer) error { return tunnel.WriteReply(w, rep) }, log)
		return
	}
	defer done()
	qs.SetWriteDeadline(time.Now().Add(edgeRequestTimeout))
	if err := tunnel.WriteReply(qs, rep); err != nil {
		log.Debug("write reply to service stream", "err", err)
		conn.Close()
		qs.CancelRead(0)
		qs.CancelWrite(0)
		return
	}
	qs.SetDeadline(time.Time{})
	tc, ok := conn.(tunnel.Conn)
	if !ok {
		tc = closeWriter{conn}
	}
	if err := tunnel.Relay(tc, qs, tunnel.RelayOptions{Idle: s.streamIdle}); err != nil {
		log.Debug("service relay ended", "service", req.String(), "err", err)
	}
}

// closeWriter is a net.Conn without a half-close: ending the write side
// closes it.
type closeWriter struct{ net.Conn }

func (c closeWriter) CloseWrite() error { return c.Conn.Close() }

// deadlineWriter writes to a stream, each write within
// poolFeedWriteTimeout.
type deadlineWriter struct{ qs *quic.Stream }

func (w deadlineWriter) Write(b []byte) (int, error) {
	w.qs.SetWriteDeadline(time.Now().Add(poolFeedWriteTimeout))
	return w.qs.Write(b)
}

// reply writes a reply with write and ends the stream: FIN after the
// reply, and nothing more is read.
func (s *Server) reply(qs *quic.Stream, write func(io.Writer) error, log *slog.Logger) {
	qs.SetWriteDeadline(time.Now().Add(edgeRequestTimeout))
	if err := write(qs); err != nil {
		log.Debug("write reply to edge stream", "err", err)
		qs.CancelWrite(0)
	} else {
		qs.Close()
	}
	qs.CancelRead(0)
}

// sizeBuffers sets the socket's buffers to size bytes and logs what the
// kernel gave, with a warning when it gave less.
func (s *Server) sizeBuffers(size int) {
	rcv, snd, forced, err := setUDPBuffers(s.udp, size)
	attrs := []any{"want", mib(size), "receive", mib(rcv), "send", mib(snd), "forced", forced}
	switch {
	case err != nil:
		s.log.Warn("tunnel listener: cannot size the UDP socket's buffers (--udp-buffer)", append(attrs, "err", err)...)
	case rcv < size || snd < size:
		s.log.Warn("tunnel listener: the kernel gave the UDP socket smaller buffers than --udp-buffer: raise net.core.rmem_max and net.core.wmem_max, or run with CAP_NET_ADMIN (docs/sizing.md)", attrs...)
	default:
		s.log.Info("tunnel listener: UDP socket buffers", attrs...)
	}
}

// mib formats a size in bytes for the logs.
func mib(n int) string { return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20)) }

// droppedDatagrams reads the datagrams the kernel dropped on the listening
// socket (SO_MEMINFO); 0 when it cannot.
func (s *Server) droppedDatagrams() float64 {
	n, err := udpDrops(s.udp)
	if err != nil {
		return 0
	}
	return float64(n)
}
