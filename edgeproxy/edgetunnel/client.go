package edgetunnel

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/tunnel"
)

// Options configure a Client. Gateways, Certificate and AllowPorts are
// required; the rest have defaults.
type Options struct {
	// Gateways are the --gateway entries (see ParseTargets).
	Gateways []string
	// ServerName, if set, is the name every gateway's certificate is
	// checked against; otherwise each entry's host part.
	ServerName string
	// RootCAs returns the CAs that verify the gateways' certificates,
	// asked at each connection (so a rotated --gateway-ca file is used
	// for the next one); nil, or a nil pool, means the system's roots.
	RootCAs func() *x509.CertPool
	// Certificate supplies the node's client certificate for each new
	// connection (tether-edge gives package identity's Cert.GetClientCertificate).
	Certificate func(*tls.CertificateRequestInfo) (*tls.Certificate, error)
	// AllowPorts are the ports the edge dials on its own addresses and
	// loopback.
	AllowPorts []uint16
	// Pods, if set, knows the node's pod ranges and pods: the edge then
	// also dials the pods of this node, on the ports AllowPodPorts or
	// their tether.io/tunnel-ports annotation allow. nil: pods are not
	// dialled.
	Pods PodSource
	// AllowPodPorts is --allow-pod-ports (ParsePodPorts); "" is
	// "declared".
	AllowPodPorts string

	// MaxServiceStreams bounds the service streams (DialService) the edge
	// has open toward one gateway replica; more are tried on the next
	// replica, or refused as Overloaded. It should not exceed the
	// gateways' --max-service-streams-per-edge: past it, a service stream
	// would wait for a place the edge's heartbeats, elections and pool
	// feed need. Default DefaultMaxServiceStreams (256).
	MaxServiceStreams int
	// MaxStreams bounds the streams being relayed at once, over all
	// gateways; more are refused as Overloaded. Default Limits.MaxStreams
	// (1024).
	MaxStreams int
	// Limits are the per-connection QUIC limits (tunnel.QUICConfig).
	Limits tunnel.Limits
	// HeaderTimeout bounds the wait for a stream's request. Default 5 s.
	HeaderTimeout time.Duration
	// DialTimeout bounds the dial of a destination. Default 5 s.
	DialTimeout time.Duration
	// HeartbeatTimeout bounds one attempt of DelegateHeartbeat on one
	// gateway replica (open a stream, send, read the reply). Default 5 s.
	HeartbeatTimeout time.Duration
	// StreamIdle ends a relay without a byte either way for this long.
	// Default 4 h, the kubelet's own streaming idle timeout.
	StreamIdle time.Duration
	// ResolveInterval is how often gateway names are resolved again.
	// Default 30 s.
	ResolveInterval time.Duration
	// Reconnect backoff: from BackoffInitial (200 ms), doubling up to
	// BackoffMax (30 s), jittered; it starts over after a connection lived
	// BackoffReset (1 min).
	BackoffInitial, BackoffMax, BackoffReset time.Duration
	// HandoverGrace: after Rotate, the old connection is closed by the
	// edge once it has had no stream for this long, if the gateway has
	// not closed it first. Default 10 s.
	HandoverGrace time.Duration

	Resolver   Resolver         // default net.DefaultResolver
	LocalAddrs AddrSource       // default InterfaceAddrs
	Dialer     Dialer           // default a net.Dialer
	Clock      clock.WithTicker // default the real clock
	Logger     *slog.Logger
	// Registry, if set, gets the tunnel's metrics.
	Registry prometheus.Registerer
}

func (o Options) withDefaults() Options {
	o.Limits.MaxStreams = cmpOr(o.Limits.MaxStreams, 1024)
	o.MaxStreams = cmpOr(o.MaxStreams, int(o.Limits.MaxStreams))
	o.MaxServiceStreams = cmpOr(o.MaxServiceStreams, DefaultMaxServiceStreams)
	o.HeaderTimeout = cmpOr(o.HeaderTimeout, 5*time.Second)
	o.DialTimeout = cmpOr(o.DialTimeout, 5*time.Second)
	o.HeartbeatTimeout = cmpOr(o.HeartbeatTimeout, 5*time.Second)
	o.StreamIdle = cmpOr(o.StreamIdle, 4*time.Hour)
	o.ResolveInterval = cmpOr(o.ResolveInterval, 30*time.Second)
	o.BackoffInitial = cmpOr(o.BackoffInitial, 200*time.Millisecond)
	o.BackoffMax = cmpOr(o.BackoffMax, 30*time.Second)
	o.BackoffReset = cmpOr(o.BackoffReset, time.Minute)
	o.HandoverGrace = cmpOr(o.HandoverGrace, 10*time.Second)
	if o.Resolver == nil {
		o.Resolver = net.DefaultResolver
	}
	if o.LocalAddrs == nil {
		o.LocalAddrs = InterfaceAddrs{}
	}
	if o.Dialer == nil {
		o.Dialer = &net.Dialer{}
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

func cmpOr[T int | int64 | time.Duration](v, def T) T {
	if v <= 0 {
		return def
	}
	return v
}

// Client keeps the tunnel to every gateway replica, serves the streams
// they open, and opens streams of its own for delegated heartbeats
// (DelegateHeartbeat).
type Client struct {
	opts     Options
	targets  []Target
	quicConf *quic.Config
	allow    *allowList
	slots    chan struct{} // one per stream being relayed
	dialer   Dialer
	clock    clock.WithTicker
	log      *slog.Logger
	metrics  *metrics

	mu       sync.Mutex
	replicas map[netip.AddrPort]*replica

	// hooks tell tests of events they wait for; nil outside tests.
	hooks struct {
		retry    func(failure, time.Duration) // a supervisor waits after a failure
		handover func(open int64)             // a handed-over connection's grace passed
	}
}

// New checks the options and registers the metrics; Run does the work.
func New(o Options) (*Client, error) {
	o = o.withDefaults()
	targets, err := ParseTargets(o.Gateways)
	if err != nil {
		return nil, err
	}
	if o.Certificate == nil {
		return nil, errors.New("no client certificate")
	}
	if len(o.AllowPorts) == 0 {
		return nil, errors.New("no allowed ports")
	}
	podPorts := DefaultPodPorts
	if o.AllowPodPorts != "" {
		if podPorts, err = ParsePodPorts(o.AllowPodPorts); err != nil {
			return nil, fmt.Errorf("allowed pod ports: %w", err)
		}
	}
	c := &Client{
		opts:     o,
		targets:  targets,
		quicConf: tunnel.QUICConfig(o.Limits),
		allow: &allowList{ports: slices.Clone(o.AllowPorts), src: o.LocalAddrs, clock: o.Clock, log: o.Logger,
			pods: o.Pods, podPorts: podPorts},
		slots:    make(chan struct{}, o.MaxStreams),
		dialer:   o.Dialer,
		clock:    o.Clock,
		log:      o.Logger,
		replicas: make(map[netip.AddrPort]*replica),
	}
	if c.metrics, err = newMetrics(o.Registry, c); err != nil {
		return nil, err
	}
	return c, nil
}

// Run keeps one connection per resolved gateway replica until ctx ends,
// then closes them all and returns once every supervisor has stopped.
func (c *Client) Run(ctx context.Context) error {
	defer c.stopAll()
	bo := backoff{initial: time.Second, max: c.opts.ResolveInterval}
	var current map[netip.AddrPort]endpoint
	for {
		next, err := resolve(ctx, c.opts.Resolver, c.targets, c.opts.ServerName, current)
		wait := c.opts.ResolveInterval
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			c.log.Warn("cannot resolve every gateway; keeping the addresses they had", "err", err)
			wait = bo.next() // retry sooner than the interval
		} else {
			bo.reset()
		}
		current = next
		c.reconcile(ctx, current)

		t := c.clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
	}
}

// reconcile starts a supervisor for every new replica address and stops
// the supervisors of addresses that vanished.
func (c *Client) reconcile(ctx context.Context, want map[netip.AddrPort]endpoint) {
	c.mu.Lock()
	var gone []*replica
	for addr, r := range c.replicas {
		if _, ok := want[addr]; !ok {
			gone = append(gone, r)
			delete(c.replicas, addr)
		}
	}
	for addr, ep := range want {
		if _, ok := c.replicas[addr]; ok {
			continue
		}
		rctx, cancel := context.WithCancel(ctx)
		r := &replica{
			c: c, ep: ep, cancel: cancel, done: make(chan struct{}), rotate: make(chan struct{}, 1),
			serviceSlots: make(chan struct{}, c.opts.MaxServiceStreams),
			log:          c.log.With("gateway", addr.String()),
			since:        c.clock.Now(),
		}
		c.replicas[addr] = r
		r.log.Info("gateway replica added", "entry", ep.target.String())
		go r.run(rctx)
	}
	c.mu.Unlock()
	for _, r := range gone {
		r.log.Info("gateway replica gone from the resolved addresses; closing its connection")
		r.stop()
	}
}

// Rotate tells every gateway connection that the client certificate
// changed: each dials a new connection, which presents the new
// certificate and takes the new streams, while the old one keeps the
// streams it relays until they end (the gateway then closes it). A
// connection that fails to come up leaves the old one in use.
func (c *Client) Rotate() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.replicas {
		select {
		case r.rotate <- struct{}{}:
		default: // one is pending already
		}
	}
}

// stopAll stops every supervisor, at the end of Run.
func (c *Client) stopAll() {
	c.mu.Lock()
	rs := c.replicas
	c.replicas = make(map[netip.AddrPort]*replica)
	c.mu.Unlock()
	for _, r := range rs {
		r.cancel()
	}
	for _, r := range rs {
		<-r.done
	}
}

// Ready reports nil when at least one gateway connection is up.
func (c *Client) Ready() error {
	for _, s := range c.Status() {
		if s.Connected {
			return nil
		}
	}
	return fmt.Errorf("not connected to any gateway (%s)", joinTargets(c.targets))
}

func joinTargets(ts []Target) string {
	var b []byte
	for i, t := range ts {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = append(b, t.String()...)
	}
	return string(b)
}

// Status lists the gateway replicas, sorted by address.
func (c *Client) Status() []statusapi.GatewayConnection {
	c.mu.Lock()
	rs := make([]*replica, 0, len(c.replicas))
	for _, r := range c.replicas {
		rs = append(rs, r)
	}
	c.mu.Unlock()
	slices.SortFunc(rs, func(a, b *replica) int { return a.ep.addr.Compare(b.ep.addr) })
	out := make([]statusapi.GatewayConnection, 0, len(rs))
	for _, r := range rs {
		out = append(out, r.status())
	}
	return out
}

func (r *replica) status() statusapi.GatewayConnection {
	r.mu.Lock()
	conn, since, lastErr := r.conn, r.since, r.lastErr
	r.mu.Unlock()
	s := statusapi.GatewayConnection{
		Gateway:     r.ep.addr.String(),
		Entry:       r.ep.target.String(),
		ServerName:  r.ep.serverName,
		Connected:   conn != nil,
		Since:       since,
		StreamsOpen: r.streamsOpen.Load(),
		Streams:     r.streamsTotal.Load(),
		BytesUp:     r.bytesUp.Load(),
		BytesDown:   r.bytesDown.Load(),
		Reconnects:  r.reconnects.Load(),
		LastError:   lastErr,
	}
	if conn != nil {
		s.RTTSeconds = conn.ConnectionStats().SmoothedRTT.Seconds()
	}
	return s
}
