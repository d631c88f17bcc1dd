// Package upstream is how tether-edge reaches the cloud kube-apiservers:
// one HTTP/2 transport with the node's credentials, tuned to notice a dead
// connection in seconds, HTTP/1.1 connections driven by the caller for
// gets and lists (Reads), an HTTP/1.1 transport for protocol upgrades
// (exec, attach, port-forward), and a health checker per server with
// hysteresis. Servers are used in priority order: the first healthy one
// in the list serves every request.
package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/internal/statusapi"
)

// Options configure New.
type Options struct {
	// Servers are the apiservers' base URLs (https://host:port), in
	// priority order.
	Servers []string
	// TLS holds the client certificate (or GetClientCertificate) and the
	// roots that verify the servers.
	TLS *tls.Config
	// BearerToken, if set, authenticates every request.
	BearerToken string
	// DialContext dials the servers; nil means a net.Dialer with a 5 s
	// timeout.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// PingAfter is how long an HTTP/2 connection may stay silent before a
	// ping is sent (default 5 s); PingTimeout is how long the ping may go
	// unanswered before the connection is closed (default 3 s).
	PingAfter, PingTimeout time.Duration
	Health                 HealthOptions
	// Clock drives the health checks; nil means the real clock.
	Clock clock.WithTicker
	// Logger; nil discards.
	Logger *slog.Logger
	// Registerer gets the metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Upstreams is the set of servers with their health.
type Upstreams struct {
	servers []*server
	pools   *pools            // the connection pools, replaced by Rotate
	rt      http.RoundTripper // HTTP/2
	reads   http.RoundTripper // HTTP/1.1 for gets and lists (Reads)
	upgrade http.RoundTripper // HTTP/1.1
	pod     *podTransport     // pods' requests: no credential of the node
	health  HealthOptions
	clock   clock.WithTicker
	log     *slog.Logger
	known   chan struct{} // closed once every server has a state

	mu      sync.Mutex
	healthy bool
	changed chan struct{} // closed and replaced when healthy changes

	metrics *metrics // nil without a Registerer
}

type server struct {
	url  *url.URL
	name string
	kick chan struct{}

	mu         sync.Mutex
	path       string
	h          hysteresis
	lastErr    string
	lastProbe  time.Time
	lastChange time.Time
	probes     uint64
}

// New checks the options and builds the transports; Run starts the
// health checks.
func New(o Options) (*Upstreams, error) {
	if len(o.Servers) == 0 {
		return nil, errors.New("no apiserver to reach")
	}
	u := &Upstreams{health: o.Health.withDefaults(), clock: o.Clock, log: o.Logger,
		known: make(chan struct{}), changed: make(chan struct{})}
	if u.clock == nil {
		u.clock = clock.RealClock{}
	}
	if u.log == nil {
		u.log = slog.New(slog.DiscardHandler)
	}
	for _, s := range o.Servers {
		pu, err := url.Parse(strings.TrimRight(s, "/"))
		if err != nil || pu.Host == "" || (pu.Scheme != "https" && pu.Scheme != "http") || (pu.Path != "" && pu.Path != "/") {
			return nil, fmt.Errorf("apiserver address %q: want https://host:port", s)
		}
		pu.Path = ""
		u.servers = append(u.servers, &server{url: pu, name: pu.Host, path: u.health.Path, kick: make(chan struct{}, 1),
			h: hysteresis{failureThreshold: u.health.FailureThreshold, successThreshold: u.health.SuccessThreshold}})
	}
	u.pools = newPools(o)
	u.rt, u.reads, u.upgrade = &u.pools.h2, &u.pools.reads, &u.pools.h1
	u.pod = newPodTransport(o)
	if o.BearerToken != "" {
		u.rt = &bearer{token: o.BearerToken, rt: u.rt}
		u.reads = &bearer{token: o.BearerToken, rt: u.reads}
		u.upgrade = &bearer{token: o.BearerToken, rt: u.upgrade}
	}
	names := make([]string, len(u.servers))
	for i, s := range u.servers {
		names[i] = s.name
	}
	var err error
	if u.metrics, err = newMetrics(o.Registerer, names); err != nil {
		return nil, err
	}
	return u, nil
}

// Rotate makes new requests use new connections, whose handshakes present
// the client certificate of the moment; requests in flight (watches,
// exec sessions) finish on the connections they use, which are closed once
// idle. Call it when the client certificate was renewed: kube-apiserver
// authenticates each request by the certificate of its connection, so a
// connection made with the previous one would be refused once that
// expires.
func (u *Upstreams) Rotate() { u.pools.rotate() }

// pools are the HTTP/2 and HTTP/1.1 transports of the moment. h2, reads
// and h1 are what requests go through: each request takes the transport
// that is current when it starts.
type pools struct {
	o      Options
	h2, h1 rotating
	reads  rotatingReads
}

func newPools(o Options) *pools {
	p := &pools{o: o}
	h2, h1 := newTransports(o)
	p.h2.cur.Store(h2)
	p.h1.cur.Store(h1)
	p.reads.cur.Store(p.newReads())
	return p
}

// newReads makes the transport for gets and lists; it falls back to the
// HTTP/2 transport of the moment.
func (p *pools) newReads() *Reads {
	after, timeout := pingTimes(p.o)
	return newReads(p.o.TLS, dialer(p.o), &p.h2, after, timeout)
}

// rotate puts new transports in place. The old ones' idle connections
// close now, their busy ones when their requests are done and they have
// been idle for IdleConnTimeout (Reads: at once).
func (p *pools) rotate() {
	h2, h1 := newTransports(p.o)
	p.h2.cur.Swap(h2).CloseIdleConnections()
	p.h1.cur.Swap(h1).CloseIdleConnections()
	p.reads.cur.Swap(p.newReads()).close()
}

// rotatingReads is an http.RoundTripper over the Reads of the moment.
type rotatingReads struct {
	cur atomic.Pointer[Reads]
}

func (r *rotatingReads) RoundTrip(req *http.Request) (*http.Response, error) {
	return r.cur.Load().RoundTrip(req)
}

// rotating is an http.RoundTripper over the transport of the moment.
type rotating struct {
	cur atomic.Pointer[http.Transport]
}

func (r *rotating) RoundTrip(req *http.Request) (*http.Response, error) {
	return r.cur.Load().RoundTrip(req)
}

// CloseIdleConnections is for http.Client.CloseIdleConnections.
func (r *rotating) CloseIdleConnections() { r.cur.Load().CloseIdleConnections() }

// newTransports returns an HTTP/2 transport whose connections are pinged
// after PingAfter of silence and closed when a ping goes unanswered for
// PingTimeout, and an HTTP/1.1 transport for upgrades.
func newTransports(o Options) (h2, h1 *http.Transport) {
	dial := dialer(o)
	pingAfter, pingTimeout := pingTimes(o)
	tlsConf := o.TLS
	if tlsConf == nil {
		tlsConf = &tls.Config{}
	}
	var p2 http.Protocols // HTTP/2 where ALPN agrees, as kube-apiserver does
	p2.SetHTTP1(true)
	p2.SetHTTP2(true)
	t2 := &http.Transport{
		DialContext:         dial,
		TLSClientConfig:     tlsConf.Clone(),
		TLSHandshakeTimeout: 5 * time.Second,
		IdleConnTimeout:     90 * time.Second,
		MaxIdleConnsPerHost: 8,
		Protocols:           &p2,
		HTTP2: &http.HTTP2Config{
			SendPingTimeout:  pingAfter,
			PingTimeout:      pingTimeout,
			WriteByteTimeout: 10 * time.Second,
		},
	}
	var p1 http.Protocols
	p1.SetHTTP1(true)
	t1conf := tlsConf.Clone()
	t1conf.NextProtos = []string{"http/1.1"}
	t1 := &http.Transport{
		DialContext:         dial,
		TLSClientConfig:     t1conf,
		TLSHandshakeTimeout: 5 * time.Second,
		IdleConnTimeout:     90 * time.Second,
		Protocols:           &p1,
	}
	return t2, t1
}

// dialer is o's DialContext, or a net.Dialer with a 5 s timeout.
func dialer(o Options) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if o.DialContext != nil {
		return o.DialContext
	}
	return (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}).DialContext
}

// pingTimes are o's PingAfter and PingTimeout, or their defaults.
func pingTimes(o Options) (after, timeout time.Duration) {
	after, timeout = o.PingAfter, o.PingTimeout
	if after <= 0 {
		after = 5 * time.Second
	}
	if timeout <= 0 {
		timeout = 3 * time.Second
	}
	return after, timeout
}

type bearer struct {
	token string
	rt    http.RoundTripper
}

func (b *bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.rt.RoundTrip(r)
}

// Transport is the HTTP/2 transport for requests to the servers.
func (u *Upstreams) Transport() http.RoundTripper { return u.rt }

// ReadTransport is the transport for requests that end and have no body
// (get and list, never watches): see Reads.
func (u *Upstreams) ReadTransport() http.RoundTripper { return u.reads }

// UpgradeTransport is the HTTP/1.1 transport for protocol upgrades.
func (u *Upstreams) UpgradeTransport() http.RoundTripper { return u.upgrade }

// Run runs the health checks until ctx ends.
func (u *Upstreams) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	maxInflight := int(u.health.Timeout/u.health.Interval) + 1
	for _, s := range u.servers {
		g.Go(func() error {
			probeLoop(ctx, u.clock, u.health.Interval, maxInflight, s.kick,
				func(ctx context.Context) error { return u.probe(ctx, s) },
				func(err error) { u.observe(s, err) }, nil)
			return nil
		})
	}
	return g.Wait()
}

// probe asks one server for its health path.
func (u *Upstreams) probe(ctx context.Context, s *server) error {
	ctx, cancel := context.WithTimeout(ctx, u.health.Timeout)
	defer cancel()
	s.mu.Lock()
	path := s.path
	s.mu.Unlock()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url.String()+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "tether-edge/health-check")
	resp, err := u.rt.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
	switch {
	case resp.StatusCode == http.StatusOK:
		return nil
	case resp.StatusCode == http.StatusNotFound && path != "/healthz":
		u.log.Info("apiserver has no "+path+"; probing /healthz", "server", s.name)
		s.mu.Lock()
		s.path = "/healthz"
		s.mu.Unlock()
		return nil // it answered: it is alive
	}
	return fmt.Errorf("%s %s: %s", path, resp.Status, strings.TrimSpace(string(body)))
}

// observe applies a probe result to a server and to the overall state.
func (u *Upstreams) observe(s *server, err error) {
	ok := err == nil
	s.mu.Lock()
	wasKnown := s.h.known
	changed := s.h.observe(ok)
	s.probes++
	s.lastProbe = u.clock.Now()
	if err != nil {
		s.lastErr = err.Error()
	}
	if changed {
		s.lastChange = s.lastProbe
	}
	healthy := s.h.healthy
	s.mu.Unlock()

	result := "ok"
	if !ok {
		result = "fail"
	}
	u.metrics.probed(s.name, result)
	if changed {
		u.metrics.setHealthy(s.name, healthy)
		switch {
		case healthy:
			u.log.Info("apiserver healthy", "server", s.name)
		case wasKnown:
			u.log.Warn("apiserver unhealthy", "server", s.name, "failures", u.health.FailureThreshold, "err", err)
		default:
			u.log.Warn("apiserver unreachable at start", "server", s.name, "err", err)
		}
	}
	u.update()
}

// update recomputes the overall state and wakes the waiters of Changed.
func (u *Upstreams) update() {
	healthy, known := false, true
	for _, s := range u.servers {
		s.mu.Lock()
		healthy = healthy || (s.h.known && s.h.healthy)
		known = known && s.h.known
		s.mu.Unlock()
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if known || healthy {
		select {
		case <-u.known:
		default:
			close(u.known)
		}
	}
	if healthy != u.healthy {
		u.healthy = healthy
		close(u.changed)
		u.changed = make(chan struct{})
	}
}

// Healthy reports whether at least one server is healthy.
func (u *Upstreams) Healthy() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.healthy
}

// Changed returns a channel closed at the next change of Healthy.
func (u *Upstreams) Changed() <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.changed
}

// WaitKnown waits until a server is healthy or every server has been
// probed once, or ctx ends. Requests that arrive at start wait for it
// rather than guess.
func (u *Upstreams) WaitKnown(ctx context.Context) {
	select {
	case <-u.known:
	case <-ctx.Done():
	}
}

// Server returns the first healthy server, or the first server and
// false when none is.
func (u *Upstreams) Server() (*url.URL, bool) {
	for _, s := range u.servers {
		s.mu.Lock()
		ok := s.h.known && s.h.healthy
		s.mu.Unlock()
		if ok {
			return s.url, true
		}
	}
	return u.servers[0].url, false
}

// Kick asks for a probe of every server now (unless one is running): a
// request just failed, so the state may be stale.
func (u *Upstreams) Kick() {
	for _, s := range u.servers {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// Ready is nil while a server is healthy.
func (u *Upstreams) Ready() error {
	if u.Healthy() {
		return nil
	}
	return errors.New("no apiserver is healthy")
}

// Status returns every server's state, in priority order, for /status.
func (u *Upstreams) Status() []statusapi.Upstream {
	out := make([]statusapi.Upstream, 0, len(u.servers))
	for _, s := range u.servers {
		s.mu.Lock()
		out = append(out, statusapi.Upstream{Server: s.url.String(), Healthy: s.h.known && s.h.healthy, Known: s.h.known,
			LastError: s.lastErr, LastProbe: s.lastProbe, Since: s.lastChange, Probes: s.probes})
		s.mu.Unlock()
	}
	return out
}

// PodTransport carries requests of pods (tether-edge's pod listener) to
// the same servers, verified by the same roots, with the pod's own
// Authorization header and no credential of the node: no client
// certificate (kube-apiserver tries x509 before bearer tokens, so a
// connection that showed the node's certificate would run every pod
// request as the node) and no bearer token of the node. Protocol upgrades
// go over HTTP/1.1, everything else over HTTP/2 where the server agrees.
func (u *Upstreams) PodTransport() http.RoundTripper { return u.pod }

// podTransport routes upgrades to its HTTP/1.1 transport.
type podTransport struct {
	h2, h1 *http.Transport
}

func newPodTransport(o Options) *podTransport {
	tlsConf := &tls.Config{}
	if o.TLS != nil {
		tlsConf = o.TLS.Clone()
	}
	tlsConf.Certificates, tlsConf.GetClientCertificate = nil, nil
	o.TLS = tlsConf
	h2, h1 := newTransports(o)
	return &podTransport{h2: h2, h1: h1}
}

func (t *podTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	for _, c := range r.Header.Values("Connection") {
		for _, tok := range strings.Split(c, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "upgrade") {
				return t.h1.RoundTrip(r)
			}
		}
	}
	return t.h2.RoundTrip(r)
}
