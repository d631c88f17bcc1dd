package edgetunnel

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
	"golang.org/x/sync/errgroup"

	"github.com/tether-edge/tether/tunnel"
)

// replica is one gateway replica address and its supervisor.
type replica struct {
	c   *Client
	ep  endpoint
	log *slog.Logger

	cancel context.CancelFunc
	done   chan struct{}
	rotate chan struct{} // Client.Rotate: hand over to a new connection
	// serviceSlots holds one token per service stream open toward this
	// replica (DialService).
	serviceSlots chan struct{}
	// draining counts connections handed over and still relaying; run
	// waits for them before it is done.
	draining sync.WaitGroup

	mu      sync.Mutex
	conn    *quic.Conn // nil while disconnected
	since   time.Time  // of the last change between connected and not
	lastErr string

	streamsOpen, streamsTotal atomic.Int64
	bytesUp, bytesDown        atomic.Int64 // up: edge to cloud
	reconnects                atomic.Int64
	probes                    atomic.Int64          // liveness probes sent (probe.go)
	ends                      [numEnds]atomic.Int64 // connections that were up and ended, by endOf
}

// run is the supervisor: dial, serve until the connection dies, wait a
// jittered backoff, again, until ctx ends. The backoff starts over once a
// connection has lived for BackoffReset.
func (r *replica) run(ctx context.Context) {
	defer close(r.done)
	defer r.draining.Wait()
	bo := backoff{initial: r.c.opts.BackoffInitial, max: r.c.opts.BackoffMax}
	for first := true; ; first = false {
		if !first {
			r.reconnects.Add(1)
		}
		lived, err := r.connectAndServe(ctx)
		if ctx.Err() != nil {
			return
		}
		if lived >= r.c.opts.BackoffReset {
			bo.reset()
		}
		if failureOf(err) == gatewayBusy {
			bo.busy(busyBackoff, busyBackoffMax)
		}
		wait := bo.next()
		r.logFailure(err, lived, wait)
		if h := r.c.hooks.retry; h != nil {
			h(failureOf(err), wait)
		}

		t := r.c.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// stop ends the supervisor and waits until its connection is closed.
func (r *replica) stop() {
	r.cancel()
	<-r.done
}

// connectAndServe dials the replica and serves its streams until the
// connection ends. lived is how long it was connected (zero if the dial
// failed). On a rotation it hands over to a new connection (handover)
// and serves that one.
func (r *replica) connectAndServe(ctx context.Context) (lived time.Duration, _ error) {
	conn, err := r.dial(ctx)
	if err != nil {
		r.setErr(err)
		return 0, err
	}
	select {
	case <-r.rotate: // a rotation before this dial: it has the new certificate
	default:
	}
	start := r.c.clock.Now()
	r.setConn(conn, start)
	r.log.Info("connected to gateway", "server_name", r.ep.serverName, "rtt", conn.ConnectionStats().SmoothedRTT)
	cur := r.serve(ctx, conn)
	for err == nil {
		select {
		case err = <-cur.ended:
			if err == nil {
				err = errors.New("connection ended")
			}
		case <-r.rotate:
			next, derr := r.dial(ctx)
			if derr != nil {
				r.log.Warn("client certificate rotated, but a new connection to the gateway failed; the current one stays", "err", derr)
				continue
			}
			r.log.Info("client certificate rotated: new streams on a new connection; the old one ends with the streams it relays",
				"rtt", next.ConnectionStats().SmoothedRTT)
			r.draining.Add(1)
			go func(old served) {
				defer r.draining.Done()
				r.handedOver(old)
			}(cur)
			conn = next
			r.setConn(conn, r.c.clock.Now())
			cur = r.serve(ctx, conn)
		}
	}
	lived = r.c.clock.Since(start)
	if ctx.Err() == nil {
		r.ends[endOf(err)].Add(1)
	}
	r.setConn(nil, r.c.clock.Now())
	r.setErr(err)
	return lived, err
}

// handedOver waits for a handed-over connection to end: the gateway
// closes it when its last stream ends; failing that, the edge closes it
// once it has had no stream for Options.HandoverGrace (the gateway may
// still open one on it before it has registered the new connection).
func (r *replica) handedOver(s served) {
	t := r.c.clock.NewTicker(r.c.opts.HandoverGrace)
	defer t.Stop()
	for {
		select {
		case <-s.ended:
			return
		case <-t.C():
		}
		open := s.open.Load()
		if open == 0 {
			s.conn.CloseWithError(tunnel.CloseNormal, "handed over to a newer connection")
		}
		if h := r.c.hooks.handover; h != nil {
			h(open)
		}
	}
}

// served is a connection being served.
type served struct {
	conn  *quic.Conn
	open  *atomic.Int64 // streams being served on it
	ended <-chan error  // why it ended, once every stream on it is done
}

// serve accepts and serves conn's streams.
func (r *replica) serve(ctx context.Context, conn *quic.Conn) served {
	ended := make(chan error, 1)
	open := new(atomic.Int64)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		for {
			s, err := conn.AcceptStream(gctx)
			if err != nil {
				return err
			}
			open.Add(1)
			g.Go(func() error {
				defer open.Add(-1)
				r.c.handleStream(gctx, r, s)
				return nil
			})
		}
	})
	g.Go(func() error {
		r.watch(gctx, conn)
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		if ctx.Err() != nil {
			conn.CloseWithError(tunnel.CloseShutdown, "edge shutting down")
		} else {
			conn.CloseWithError(tunnel.CloseNormal, "")
		}
		return nil
	})
	go func() {
		err := g.Wait()
		if ctx.Err() == nil {
			// AcceptStream's error can be our own context's; the
			// connection's cause says why it ended.
			if cause := context.Cause(conn.Context()); cause != nil {
				err = cause
			}
		}
		ended <- err
	}()
	return served{conn: conn, open: open, ended: ended}
}

// dial opens a QUIC connection from a UDP socket of its own: a fresh
// source port per connection also gives a fresh NAT mapping.
func (r *replica) dial(ctx context.Context) (*quic.Conn, error) {
	udp, err := net.ListenUDP("udp", nil)
	if err != nil {
		return nil, fmt.Errorf("open UDP socket: %w", err)
	}
	var roots *x509.CertPool
	if r.c.opts.RootCAs != nil {
		roots = r.c.opts.RootCAs()
	}
	tlsConf := tunnel.ClientTLS(r.c.opts.Certificate, roots, r.ep.serverName)
	dctx, cancel := context.WithTimeout(ctx, 2*r.c.quicConf.HandshakeIdleTimeout)
	defer cancel()
	conn, err := quic.Dial(dctx, udp, net.UDPAddrFromAddrPort(r.ep.addr), tlsConf, r.c.quicConf)
	if err != nil {
		udp.Close()
		return nil, fmt.Errorf("dial gateway %s: %w", r.ep.addr, err)
	}
	// quic.Dial does not close a socket it was given.
	context.AfterFunc(conn.Context(), func() { udp.Close() })
	return conn, nil
}

// logFailure says why the replica is not connected, with what the
// operator can do about it.
func (r *replica) logFailure(err error, lived, wait time.Duration) {
	attrs := []any{"err", err, "retry_in", wait.Round(time.Millisecond)}
	switch failureOf(err) {
	case identityRefused:
		r.log.Error("gateway refused this node's identity; check --cert/--key (CN=system:node:<name>, O=system:nodes) and the gateway's --client-ca", attrs...)
	case gatewayUntrusted:
		r.log.Error("gateway's certificate not trusted; check --gateway-ca and --gateway-server-name", attrs...)
	case gatewayBusy:
		r.log.Warn("gateway refused the handshake with an internal error: it is busy, as when thousands of edges dial it at once, or has no serving certificate yet (its log says which); dialling again in a few seconds", attrs...)
	case replaced:
		r.log.Warn("gateway replaced this connection with a newer one of the same node; is another edge using this node's certificate?", attrs...)
	default:
		if lived > 0 {
			r.log.Warn("disconnected from gateway", append(attrs, "reason", endNames[endOf(err)], "connected_for", lived.Round(time.Millisecond))...)
		} else {
			r.log.Warn("cannot connect to gateway", attrs...)
		}
	}
}

type failure int

const (
	otherFailure failure = iota
	identityRefused
	gatewayUntrusted
	replaced
	gatewayBusy
)

// busyBackoff is the least wait after the gateway refused a handshake as
// busy, drawn from [2 s, 4 s): the gateway kept this edge waiting for a
// place for 3 s already (its --max-handshakes), and the edges it refused
// come back spread out instead of all within the usual first wait of
// 200 ms, where most would be refused again (docs/sizing.md).
//
// busyBackoffMax is the most: after repeated busy refusals the wait grows
// to [4 s, 8 s) and no further. A busy gateway is up and admitting; left
// to double to BackoffMax (30 s), the edges refused four or five times in
// a cold start slept 15 to 30 s while it sat idle, and one 10,000-edge
// cold start in five took 80 to 95 s instead of 45 to 55.
const (
	busyBackoff    = 4 * time.Second
	busyBackoffMax = 8 * time.Second
)

// alertInternalError is the TLS internal_error alert as a QUIC
// CRYPTO_ERROR: the gateway's TLS stack answers it when the gateway
// refused to start the handshake (busy, or closing) or had no serving
// certificate to present; either way dialling again at once is no use.
const alertInternalError = quic.TransportErrorCode(0x100 + 80)

func failureOf(err error) failure {
	var ae *quic.ApplicationError
	if errors.As(err, &ae) && ae.Remote {
		switch ae.ErrorCode {
		case tunnel.CloseNotAllowed:
			return identityRefused
		case tunnel.CloseReplaced:
			return replaced
		}
	}
	var te *quic.TransportError
	if errors.As(err, &te) && te.ErrorCode.IsCryptoError() {
		if te.Remote && te.ErrorCode == alertInternalError {
			return gatewayBusy
		}
		if te.Remote {
			return identityRefused // the gateway's TLS stack rejected our certificate
		}
		return gatewayUntrusted
	}
	var ve *tls.CertificateVerificationError
	if errors.As(err, &ve) {
		return gatewayUntrusted
	}
	return otherFailure
}

func (r *replica) setConn(conn *quic.Conn, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.conn, r.since = conn, at
	if conn != nil {
		r.lastErr = ""
	}
}

func (r *replica) setErr(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.lastErr = err.Error()
	}
}
