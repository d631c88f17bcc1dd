// Package proxy is the gateway's transparent TCP listener: the target of
// the DNAT rules netrules installs. For every accepted connection it finds
// the edge node the client meant, opens a stream to that node's edge
// through the registry, asks the edge to dial, and relays bytes both ways.
// The client's bytes follow the request without waiting for the edge's
// reply, so a connection costs no extra round trip through the tunnel.
// It never terminates TLS.
//
// Finding the node:
//
//  1. The original destination (SO_ORIGINAL_DST, netrules.OriginalDst) is
//     looked up among the addresses that reach edge nodes in the active
//     mode. In node-ip mode the edge dials that same address; in vip mode
//     it dials the node's InternalIP (the VIP lives only on the gateway).
//  2. Otherwise the connection was addressed to the gateway itself (or to
//     an address no edge node has): the first bytes are sniffed, without
//     consuming them, for a TLS server name or an HTTP/1 Host, which names
//     a node bare or under one of the DNS zones. The port is the original
//     destination's, or Options.DefaultPort (10250) when the client dialled
//     the listener's own port.
//
// A client whose address Options.Sources refuses (one outside the VPC's
// ranges, or an edge's) is reset before anything is read.
//
// Any refusal — no route, no tunnel, no free stream, the edge's refusal —
// resets the client connection and is counted by reason
// (tether_gateway_proxy_refusals_total).
package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"

	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/gateway/registry"
	"github.com/tether-edge/tether/gateway/sources"
	"github.com/tether-edge/tether/internal/accept"
	"github.com/tether-edge/tether/netrules"
	"github.com/tether-edge/tether/tunnel"
)

// Defaults for Options.
const (
	DefaultPort         = 10250 // the kubelet's
	DefaultPeekTimeout  = 5 * time.Second
	DefaultMaxPeek      = 16 << 10
	DefaultReplyTimeout = 15 * time.Second
)

// Refusal reasons of the proxy's own, besides registry.Reason's and the
// edge's tunnel.Code names.
const (
	ReasonNoRoute      = "no_route"      // no edge node for the destination or name
	ReasonPeekTimeout  = "peek_timeout"  // the client sent no routable first bytes in time
	ReasonReplyTimeout = "reply_timeout" // the edge did not answer in time
	ReasonStreamError  = "stream_error"  // the stream failed before the reply
	ReasonSource       = "source"        // the client is not an allowed source (gateway/sources)
)

// Opener opens streams to edges; *registry.Registry is one.
type Opener interface {
	Open(ctx context.Context, node string) (*registry.Stream, error)
}

var _ Opener = (*registry.Registry)(nil)

// Options configure a Proxy.
type Options struct {
	// Mode is the address mode (node-ip or vip); "" means node-ip.
	Mode nodewatch.Mode
	// Zones are the DNS zones under which node names are routed by SNI or
	// Host (edge-1.tether.internal as well as edge-1).
	Zones []string
	// DefaultPort is dialled on the edge for a connection routed by name
	// that was addressed to the listener's own port; 0 means DefaultPort.
	DefaultPort uint16
	// PeekTimeout bounds how long a client may take to send its
	// ClientHello or request head; 0 means DefaultPeekTimeout.
	PeekTimeout time.Duration
	// MaxPeek bounds the bytes read while sniffing; 0 means DefaultMaxPeek.
	MaxPeek int
	// ReplyTimeout bounds the wait for the edge's reply (its dial); 0
	// means DefaultReplyTimeout.
	ReplyTimeout time.Duration
	// IdleTimeout ends a relay with no byte in either direction for this
	// long; 0 means none (TCP keepalive still ends dead connections).
	IdleTimeout time.Duration
	// OriginalDst returns a connection's destination before DNAT; nil
	// means netrules.OriginalDst. When it fails the connection is treated
	// as addressed to the listener.
	OriginalDst func(*net.TCPConn) (netip.AddrPort, error)
	// Sources admits clients by address before anything else; nil admits
	// every client.
	Sources *sources.Filter
	// Logger receives the proxy's logs; nil discards them.
	Logger *slog.Logger
	// Registerer, if set, gets the proxy's metrics.
	Registerer prometheus.Registerer
}

// Proxy is the transparent listener's connection handler.
type Proxy struct {
	open     Opener
	opts     Options
	origDst  func(*net.TCPConn) (netip.AddrPort, error)
	log      *slog.Logger
	zones    []string
	routes   atomic.Pointer[routes]
	metrics  *metrics
	handlers sync.WaitGroup
}

// New returns a Proxy that opens streams with open. It routes nothing
// until the first Update.
func New(open Opener, opts Options) (*Proxy, error) {
	if opts.Mode == "" {
		opts.Mode = nodewatch.ModeNodeIP
	}
	if _, err := nodewatch.ParseMode(string(opts.Mode)); err != nil {
		return nil, err
	}
	if opts.DefaultPort == 0 {
		opts.DefaultPort = DefaultPort
	}
	if opts.PeekTimeout <= 0 {
		opts.PeekTimeout = DefaultPeekTimeout
	}
	if opts.MaxPeek <= 0 {
		opts.MaxPeek = DefaultMaxPeek
	}
	if opts.ReplyTimeout <= 0 {
		opts.ReplyTimeout = DefaultReplyTimeout
	}
	p := &Proxy{open: open, opts: opts, origDst: opts.OriginalDst, log: opts.Logger, zones: normalizeZones(opts.Zones)}
	if p.origDst == nil {
		p.origDst = netrules.OriginalDst
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, err
	}
	p.metrics = m
	p.routes.Store(buildRoutes(&nodewatch.Snapshot{}, opts.Mode, p.zones))
	return p, nil
}

// Update replaces the routing index with one built from snap. Give it to
// nodewatch.Watcher.Subscribe.
func (p *Proxy) Update(snap *nodewatch.Snapshot) {
	rt := buildRoutes(snap, p.opts.Mode, p.zones)
	p.routes.Store(rt)
	p.log.Debug("proxy routes updated", "addresses", len(rt.byAddr), "names", len(rt.byName), "version", snap.Version)
}

// Serve accepts connections on ln until ctx is done, then closes ln and
// waits for the connections in progress. Those end when their relays end,
// which the tunnel server's shutdown bounds: it closes the tunnels after
// its drain deadline.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	listenPort := uint16(0)
	if a, ok := ln.Addr().(*net.TCPAddr); ok {
		listenPort = uint16(a.Port)
	}
	// Out of file descriptors and the like: Accept waits and retries, and
	// fails only once ln is closed.
	ln = accept.Listen(ln, accept.Options{Name: "proxy", Logger: p.log, Errors: p.metrics.acceptErrors})
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	p.log.Info("transparent listener up", "addr", ln.Addr().String(), "mode", p.opts.Mode)
	var err error
	for {
		var c net.Conn
		if c, err = ln.Accept(); err != nil {
			break
		}
		tc, ok := c.(*net.TCPConn)
		if !ok {
			c.Close()
			continue
		}
		p.handlers.Add(1)
		go func() {
			defer p.handlers.Done()
			p.handle(ctx, tc, listenPort)
		}()
	}
	ln.Close()
	p.handlers.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("accept: %w", err)
}

// handle serves one client connection; it closes tc.
func (p *Proxy) handle(ctx context.Context, tc *net.TCPConn, listenPort uint16) {
	p.metrics.active.Inc()
	defer p.metrics.active.Dec()
	// The connection's attributes go to debug lines only, and are
	// formatted only when those are on: a logger made With them would
	// format them for every connection.
	attrs := []any{"client", tc.RemoteAddr()}
	debug := func(msg string, args ...any) {
		if p.log.Enabled(ctx, slog.LevelDebug) {
			p.log.Debug(msg, append(attrs, args...)...)
		}
	}

	// Before a byte is read: a client that may not use the listener
	// learns nothing of the edges, not even which names route.
	if why := p.opts.Sources.Admit("proxy", tc.RemoteAddr()); why != "" {
		p.refuse(tc, nil, ReasonSource)
		debug("connection refused", "reason", ReasonSource, "source", why)
		return
	}

	tg, reason, err := p.route(tc, listenPort)
	if err != nil {
		p.refuse(tc, nil, reason)
		debug("connection refused", "reason", reason, "err", err)
		return
	}
	attrs = append(attrs, "node", tg.node, "dest", tg.dest, "by", tg.by)

	s, err := p.open.Open(ctx, tg.node)
	if err != nil {
		p.refuse(tc, nil, registry.Reason(err))
		debug("connection refused", "reason", registry.Reason(err), "err", err)
		return
	}
	defer s.Release()
	if err := tunnel.WriteRequest(s, tunnel.Request{Dest: tg.dest, Client: tc.RemoteAddr().String()}); err != nil {
		s.CancelRead(tunnel.StreamErrAbort)
		s.CancelWrite(tunnel.StreamErrAbort)
		p.refuse(tc, s.Edge(), ReasonStreamError)
		debug("connection refused", "reason", ReasonStreamError, "err", fmt.Errorf("write request: %w", err))
		return
	}
	// The client's bytes follow the request at once instead of after the
	// edge's reply: the edge reads exactly the request and drops what
	// follows if it refuses, so this saves a round trip through the tunnel
	// per connection. The relay's first read from the stream is the reply.
	s.SetReadDeadline(time.Now().Add(p.opts.ReplyTimeout))
	rs := &replyFirst{Stream: s, p: p}
	debug("relaying")
	err = tunnel.Relay(tg.conn, rs, s.RelayOptions(p.opts.IdleTimeout))
	if rs.refused != "" {
		debug("connection refused", "reason", rs.refused, "err", err)
		return
	}
	if err != nil {
		p.metrics.connections.WithLabelValues(resultRelayError).Inc()
		debug("relay ended", "err", err)
		return
	}
	p.metrics.connections.WithLabelValues(resultRelayed).Inc()
}

// replyFirst is the stream as the relay sees it: its first Read reads the
// edge's reply, and a refusal (or no reply in time) fails that Read, which
// makes the relay reset the client. The refusal is counted before that, so
// the count is in place when the client sees the reset. Only the relay's
// stream-to-client goroutine reads.
type replyFirst struct {
	*registry.Stream
	p       *Proxy
	replied bool
	refused string // the refusal reason, once counted
}

func (r *replyFirst) Read(b []byte) (int, error) {
	if !r.replied {
		r.replied = true
		_, err := tunnel.ReadReply(r.Stream)
		r.Stream.SetReadDeadline(time.Time{})
		if err != nil {
			var se *quic.StreamError
			if errors.As(err, &se) && !se.Remote {
				// The relay cancelled the stream: the client side
				// failed first. That is the relay's error, not a refusal.
				return 0, err
			}
			r.refused = replyReason(err)
			r.p.countRefusal(r.Stream.Edge(), r.refused)
			return 0, err // the relay resets the client connection
		}
	}
	return r.Stream.Read(b)
}

// replyReason is the refusal reason for a failed ReadReply.
func replyReason(err error) string {
	var refused *tunnel.RefusedError
	switch {
	case errors.As(err, &refused):
		return refused.Code.String()
	case errors.Is(err, os.ErrDeadlineExceeded):
		return ReasonReplyTimeout
	}
	return ReasonStreamError
}

// target is where a client connection goes.
type target struct {
	node string
	dest netip.AddrPort // what the edge dials
	conn tunnel.Conn    // the client connection, its sniffed bytes in front
	by   string         // how the node was found: address, sni or host
}

// route finds where tc goes. On error, reason is the refusal reason.
func (p *Proxy) route(tc *net.TCPConn, listenPort uint16) (_ target, reason string, _ error) {
	routes := p.routes.Load()
	dst, err := p.origDst(tc)
	if err != nil {
		// No DNAT (--netrules=none, or a client that dialled the listener):
		// the connection is addressed to the gateway.
		dst = tc.LocalAddr().(*net.TCPAddr).AddrPort()
		p.log.Debug("no original destination; routing by name", "client", tc.RemoteAddr().String(), "err", err)
	}
	dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
	if r, ok := routes.addr(dst.Addr()); ok {
		by := "address"
		if r.pod {
			by = "pod range"
		}
		return target{node: r.node, dest: netip.AddrPortFrom(r.dial, dst.Port()), conn: tc, by: by}, "", nil
	}

	tc.SetReadDeadline(time.Now().Add(p.opts.PeekTimeout))
	br := bufio.NewReaderSize(tc, p.opts.MaxPeek)
	name, by, err := sniff(br)
	tc.SetReadDeadline(time.Time{})
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return target{}, ReasonPeekTimeout, fmt.Errorf("sniff connection to %v: %w", dst, err)
		}
		return target{}, ReasonNoRoute, fmt.Errorf("sniff connection to %v: %w", dst, err)
	}
	r, ok := routes.name(name)
	if !ok {
		return target{}, ReasonNoRoute, fmt.Errorf("%s %q names no edge node", by, name)
	}
	port := dst.Port()
	if port == listenPort {
		port = p.opts.DefaultPort
	}
	return target{node: r.node, dest: netip.AddrPortFrom(r.dial, port), conn: &peekedConn{tc: tc, r: br}, by: by}, "", nil
}

// refuse resets the client connection and counts the refusal, also on the
// edge when there is one.
func (p *Proxy) refuse(tc *net.TCPConn, e *registry.Edge, reason string) {
	p.countRefusal(e, reason)
	tc.SetLinger(0) // close with RST: the client sees a refusal, not an empty answer
	tc.Close()
}

// countRefusal counts a refused connection by reason, also on the edge
// when there is one.
func (p *Proxy) countRefusal(e *registry.Edge, reason string) {
	if e != nil {
		e.Refused(reason)
	}
	p.metrics.connections.WithLabelValues(resultRefused).Inc()
	p.metrics.refusals.WithLabelValues(reason).Inc()
}
