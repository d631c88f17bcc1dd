package edgeservice

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/edgeproxy/edgetunnel"
	"github.com/tether-edge/tether/netrules"
	"github.com/tether-edge/tether/tunnel"
)

// DefaultListen is the default --service-listen.
const DefaultListen = ":10271"

// streamIdle ends a relay without a byte either way for this long, as
// the tunnel's own streams do (edgetunnel.Options.StreamIdle).
const streamIdle = 4 * time.Hour

// Stream is a connection to a Service through a gateway replica; Release
// ends it and frees its place (edgetunnel.ServiceStream).
type Stream interface {
	tunnel.Stream
	Release()
}

// Dialer opens streams to marked Services (edgetunnel.Client through
// Tunnel).
type Dialer interface {
	DialService(ctx context.Context, req tunnel.ServiceRequest) (Stream, error)
}

// Tunnel is the real Dialer.
type Tunnel struct{ Client *edgetunnel.Client }

var _ Dialer = Tunnel{}

// DialService implements Dialer.
func (t Tunnel) DialService(ctx context.Context, req tunnel.ServiceRequest) (Stream, error) {
	s, err := t.Client.DialService(ctx, req)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// PodRanges knows this node's pod ranges (nodepods.Pods); ok is false
// until they are known.
type PodRanges interface {
	PodRanges() (ranges []netip.Prefix, ok bool)
}

// Options configure a Server.
type Options struct {
	// Index maps original destinations to marked Services.
	Index *Index
	// Dialer opens the streams.
	Dialer Dialer
	// Pods are this node's pod ranges: their addresses are admitted.
	Pods PodRanges
	// LocalAddrs are this node's own addresses, admitted besides
	// loopback (hostNetwork pods). Default edgetunnel.InterfaceAddrs.
	LocalAddrs edgetunnel.AddrSource
	// OriginalDst reads a redirected connection's destination; default
	// netrules.OriginalDst.
	OriginalDst func(*net.TCPConn) (netip.AddrPort, error)
	// DialTimeout bounds DialService. Default 10 s.
	DialTimeout time.Duration
	Logger      *slog.Logger
	Registry    prometheus.Registerer
}

// Server is the service listener: it takes the connections the host's
// rules redirected from this node's pods to marked ClusterIPs, and
// relays each through a stream to a gateway replica, which connects it
// to an endpoint of that Service.
type Server struct {
	opts    Options
	log     *slog.Logger
	metrics *metrics

	mu       sync.Mutex
	local    []netip.Addr
	readAt   time.Time
	nowLocal func() time.Time
}

// New checks the options and registers the metrics.
func New(o Options) (*Server, error) {
	if o.Index == nil || o.Dialer == nil {
		return nil, errors.New("service listener: no index or dialer")
	}
	if o.LocalAddrs == nil {
		o.LocalAddrs = edgetunnel.InterfaceAddrs{}
	}
	if o.OriginalDst == nil {
		o.OriginalDst = netrules.OriginalDst
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(o.Registry)
	if err != nil {
		return nil, err
	}
	return &Server{opts: o, log: o.Logger, metrics: m, nowLocal: time.Now}, nil
}

// Serve accepts connections on ln until ctx ends, then closes ln and
// every connection it relays, and returns once they are done.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		tc, ok := c.(*net.TCPConn)
		if !ok {
			c.Close()
			continue
		}
		wg.Go(func() {
			end := context.AfterFunc(ctx, func() { tc.Close() })
			defer end()
			s.handle(ctx, tc)
		})
	}
}

// handle serves one connection: check its source, find its Service,
// open a stream, relay.
func (s *Server) handle(ctx context.Context, c *net.TCPConn) {
	src := c.RemoteAddr().(*net.TCPAddr).AddrPort()
	if !s.admits(src.Addr().Unmap()) {
		s.metrics.refusals.WithLabelValues(ReasonSource).Inc()
		s.log.Debug("service listener: client is no pod of this node, nor the node; reset", "client", src)
		reset(c)
		return
	}
	dst, err := s.opts.OriginalDst(c)
	req, ok := s.opts.Index.Lookup(dst)
	if err != nil || !ok {
		s.metrics.refusals.WithLabelValues(ReasonNotMarked).Inc()
		s.log.Debug("service listener: destination is no marked Service; reset", "client", src, "dest", dst, "err", err)
		reset(c)
		return
	}
	dctx, cancel := context.WithTimeout(ctx, s.opts.DialTimeout)
	st, err := s.opts.Dialer.DialService(dctx, req)
	cancel()
	if err != nil {
		var re *tunnel.RefusedError
		result := resultError
		if errors.As(err, &re) {
			result = re.Code.String()
		}
		s.metrics.streams.WithLabelValues(result).Inc()
		s.log.Debug("service listener: no stream to the Service; reset", "client", src, "dest", dst, "service", req.String(), "err", err)
		reset(c)
		return
	}
	defer st.Release()
	s.metrics.streams.WithLabelValues(tunnel.OK.String()).Inc()
	err = tunnel.Relay(c, st, tunnel.RelayOptions{Idle: streamIdle})
	s.log.Debug("service connection done", "client", src, "dest", dst, "service", req.String(), "err", err)
}

// admits reports whether a may use the listener: loopback, an address
// of this node, or one in its pod ranges.
func (s *Server) admits(a netip.Addr) bool {
	if a.IsLoopback() {
		return true
	}
	if s.opts.Pods != nil {
		if ranges, ok := s.opts.Pods.PodRanges(); ok {
			for _, p := range ranges {
				if p.Contains(a) {
					return true
				}
			}
		}
	}
	return s.isLocal(a)
}

// isLocal reports whether a is an address of this node; the addresses
// are read again at most once a second when a is not among them.
func (s *Server) isLocal(a netip.Addr) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.Contains(s.local, a) {
		return true
	}
	if now := s.nowLocal(); s.readAt.IsZero() || now.Sub(s.readAt) >= time.Second {
		s.readAt = now
		if addrs, err := s.opts.LocalAddrs.Addrs(); err == nil {
			s.local = addrs
		}
	}
	return slices.Contains(s.local, a)
}

// reset closes c with a TCP reset.
func reset(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}
