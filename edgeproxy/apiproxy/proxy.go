package apiproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/edgeproxy/apiproxy/podcache"
	"github.com/tether-edge/tether/edgeproxy/apiproxy/writequeue"
	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/edgeproxy/upstream"
	"github.com/tether-edge/tether/internal/localapi"
	"github.com/tether-edge/tether/internal/statusapi"
)

// Upstream is what the proxy needs of the cloud apiservers.
type Upstream interface {
	// Server is the apiserver to use now; ok is false when none is
	// healthy.
	Server() (u *url.URL, ok bool)
	Healthy() bool
	// Changed is closed at the next change of Healthy.
	Changed() <-chan struct{}
	// WaitKnown returns once the first health checks are done.
	WaitKnown(ctx context.Context)
	// Kick asks for a health check now: a request just failed.
	Kick()
	Transport() http.RoundTripper
	// ReadTransport carries requests that end and have no body (get,
	// list) with the least work per request.
	ReadTransport() http.RoundTripper
	UpgradeTransport() http.RoundTripper
}

var _ Upstream = (*upstream.Upstreams)(nil)

// DefaultComponents are the components whose reads are cached.
var DefaultComponents = []string{"kubelet", "kube-proxy", "coredns", "flanneld"}

// Options configure New.
type Options struct {
	Upstream Upstream
	Store    *cache.Store
	// NodeName is this node: its Lease in kube-node-lease is renewed
	// locally while the cloud is unreachable. Empty disables that.
	NodeName string
	// Components whose get, list and watch responses are cached and
	// served offline (the first word of their User-Agent).
	Components []string
	// Topology, when set, filters the EndpointSlices and Endpoints that
	// TopologyComponents get, list and watch (package filter).
	Topology           Topology
	TopologyComponents []string
	// Pool, when set, answers list and watch of pool-scope resources from
	// the node pool's replica, and takes the node's Lease renewals to the
	// pool leader while the cloud is unreachable.
	Pool Pool
	// Pods, when set, serves pods of the node with their own credentials
	// (PodHandler, podapi.go).
	Pods *PodOptions
	// HeldWatchRecheck is how often a watch held open after its
	// upstream broke looks whether the cloud answers again though the
	// health checks never failed, and how often a watch served from the
	// pool's replica looks whether the replica still serves (default
	// 30 s).
	HeldWatchRecheck time.Duration
	// ReleaseJitter spreads the end of held watches when the cloud is
	// back over up to this long (default 1 s), so that clients do not
	// all come back at once.
	ReleaseJitter time.Duration
	Clock         clock.WithTicker
	Logger        *slog.Logger
	Registerer    prometheus.Registerer
}

const (
	// maxBody bounds the request bodies the proxy reads (kube-apiserver's
	// own limit is 3 MiB).
	maxBody = 3 << 20
	// maxCachedResponse bounds the responses copied for the cache.
	maxCachedResponse = 256 << 20
)

var (
	leasesGVR = schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
	podsGVR   = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	nodesGVR  = schema.GroupVersionResource{Version: "v1", Resource: "nodes"}
)

// Proxy is the kube-apiserver proxy for node components.
type Proxy struct {
	up      Upstream
	store   *cache.Store
	node    string
	cached  map[string]bool
	recheck time.Duration
	jitter  time.Duration
	clock   clock.WithTicker
	log     *slog.Logger
	m       *metrics
	reverse *httputil.ReverseProxy
	upgrade *httputil.ReverseProxy
	rt      http.RoundTripper // counting bytes
	reads   http.RoundTripper // for gets and lists, counting bytes

	// queue keeps the status writes made offline and replays them.
	queue writeQueue

	topo      Topology
	topoComps map[string]bool
	topoObjs  topoObjects

	pool       Pool
	delegating chan struct{} // one delegated heartbeat in flight

	// lastGet holds, per component and path, a hash of the last get
	// answer cached (cleared whenever an object is answered locally).
	lastGet sync.Map

	tokenLog tokenLog // token requests whose miss was logged (token.go)

	// The pod listener (podapi.go); podCache is nil when it is off.
	podCache   *podcache.Cache
	podRT      http.RoundTripper // counting bytes
	podReverse *httputil.ReverseProxy
	podIDs     podIdentities
	podService *kubernetesService // the kubelet's view of default/kubernetes; nil: unchanged
}

// New builds the proxy; Run replays queued writes, Serve serves clients.
func New(o Options) (*Proxy, error) {
	if o.Upstream == nil || o.Store == nil {
		return nil, errors.New("apiproxy: Upstream and Store are required")
	}
	p := &Proxy{up: o.Upstream, store: o.Store, node: o.NodeName, cached: map[string]bool{},
		recheck: o.HeldWatchRecheck, jitter: o.ReleaseJitter, clock: o.Clock, log: o.Logger,
		pool: o.Pool, delegating: make(chan struct{}, 1)}
	if p.recheck <= 0 {
		p.recheck = 30 * time.Second
	}
	if p.jitter <= 0 {
		p.jitter = time.Second
	}
	if p.clock == nil {
		p.clock = clock.RealClock{}
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	for _, c := range o.Components {
		p.cached[c] = true
	}
	if o.Topology != nil {
		p.topo, p.topoComps = o.Topology, map[string]bool{}
		for _, c := range o.TopologyComponents {
			p.topoComps[c] = true
		}
	}
	var err error
	if p.m, err = newMetrics(o.Registerer); err != nil {
		return nil, err
	}
	p.rt = &countingTransport{rt: p.up.Transport(), m: p.m}
	if p.queue, err = writequeue.New(writequeue.Options{Store: o.Store, Upstream: o.Upstream, Transport: p.rt, NodeName: o.NodeName,
		Clock: p.clock, Logger: p.log, Registerer: o.Registerer}); err != nil {
		return nil, fmt.Errorf("apiproxy: %w", err)
	}
	p.reads = &countingTransport{rt: p.up.ReadTransport(), m: p.m}
	rewrite := func(pr *httputil.ProxyRequest) {
		srv, _ := p.up.Server()
		pr.SetURL(srv)
		pr.Out.Host = ""
		pr.Out.Header.Del("Authorization") // the proxy's identity is the node's
	}
	errLog := slog.NewLogLogger(p.log.Handler(), slog.LevelDebug)
	p.reverse = &httputil.ReverseProxy{Rewrite: rewrite, Transport: p.rt, FlushInterval: -1,
		ErrorHandler: p.proxyError, ErrorLog: errLog}
	p.upgrade = &httputil.ReverseProxy{Rewrite: rewrite, Transport: &countingTransport{rt: p.up.UpgradeTransport(), m: p.m},
		FlushInterval: -1, ErrorHandler: p.proxyError, ErrorLog: errLog}
	if o.Pods != nil {
		if o.Pods.Transport == nil || o.Pods.Cache == nil {
			return nil, errors.New("apiproxy: Pods needs a Transport and a Cache")
		}
		p.podCache, p.podRT = o.Pods.Cache, &countingTransport{rt: o.Pods.Transport, m: p.m}
		p.podReverse = p.newPodReverse()
		if len(o.Pods.Addresses) > 0 {
			p.podService = &kubernetesService{ips: o.Pods.Addresses, port: o.Pods.Port}
		}
		if err := p.loadPodIdentities(); err != nil {
			return nil, fmt.Errorf("apiproxy: pod identities: %w", err)
		}
	}
	return p, nil
}

// writeQueue is what the proxy needs of the queue of status writes made
// offline (package writequeue).
type writeQueue interface {
	// Enqueue keeps w on disk, coalesced with the object's latest queued
	// patch where they coalesce; base is the object as cached before w,
	// result as the edge answers it.
	Enqueue(w *cache.QueuedWrite, base, result []byte) error
	// Queued reports whether writes of the object are queued.
	Queued(o writequeue.Object) bool
	// Len is the number of queued writes.
	Len() int
	// Ledger is the queue's ledger, nil if it does not read.
	Ledger() *statusapi.QueueLedger
	// Kick has Run look at the queue now.
	Kick()
	// Run replays queued writes whenever the cloud is healthy.
	Run(ctx context.Context) error
}

var _ writeQueue = (*writequeue.Queue)(nil)

// Run replays the status writes queued offline whenever the cloud is
// healthy, until ctx ends (package writequeue).
func (p *Proxy) Run(ctx context.Context) error { return p.queue.Run(ctx) }

// Serve serves clients on ln until ctx ends; requests in flight (held
// watches too) end with ctx.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	return serveHTTP(ctx, ln, p, p.log, "apiserver proxy")
}

// serveHTTP serves h on ln until ctx ends; requests in flight end with
// ctx.
func serveHTTP(ctx context.Context, ln net.Listener, h http.Handler, log *slog.Logger, what string) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       90 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close()
		}
	}()
	err := srv.Serve(ln)
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// startReadWait bounds how long a read of a cached component waits, at
// start, for the first verdict on the cloud. A cloud that drops packets is
// judged only when a probe times out (5 s); a kubelet booted in a cut
// site then gets its first lists from the cache within this bound rather
// than after the probe, and, online, its informers start from the cache
// if the first probe is slow, then watch the cloud from there.
const startReadWait = time.Second

// ServeHTTP serves one request of a node component.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	req := p.classify(r)
	p.waitKnown(r, req)
	served := p.serve(w, r, req)
	p.m.requests.WithLabelValues(req.label, req.Verb, served).Inc()
}

// waitKnown waits for the first health checks, before which the proxy
// cannot tell online from offline: writes and relayed requests as long as
// they take, cached reads at most startReadWait (then the cache answers).
func (p *Proxy) waitKnown(r *http.Request, req request) {
	if req.kind != kindRead && req.kind != kindWatch {
		p.up.WaitKnown(r.Context())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), startReadWait)
	defer cancel()
	p.up.WaitKnown(ctx)
}

// serve is the proxy's decision table: req's kind, and whether the cloud
// (or the node pool's replica) answers now.
func (p *Proxy) serve(w http.ResponseWriter, r *http.Request, req request) string {
	healthy := p.up.Healthy()
	pool := req.pool && p.pool.Serves(req.GVR, healthy)
	if req.filtered && (healthy || pool) && !req.filter.WaitSynced(r.Context(), topologySyncWait) {
		topologyNotSynced(w)
		return servedRefused
	}
	switch {
	case pool && req.Verb == localapi.VerbWatch:
		p.forwardWatch(w, r, req, viaPool)
		return servedPool
	case pool:
		p.forwardRead(w, r, req, viaPool)
		return servedPool
	}
	switch req.kind {
	case kindUpgrade:
		if !healthy {
			unreachable(w, "%s %s cannot be relayed offline", r.Method, r.URL.Path)
			return servedRefused
		}
		p.upgrade.ServeHTTP(w, r)
		return servedUpstream
	case kindWatch:
		if !healthy {
			return p.serveWatch(w, r, req, p.clock.Now(), cloudOffline, unreachableMessage)
		}
		return p.forwardWatch(w, r, req, viaCloud)
	case kindRead:
		if !healthy {
			return p.serveRead(w, r, req, unreachableMessage)
		}
		return p.forwardRead(w, r, req, viaCloud)
	case kindLease, kindStatus:
		return p.write(w, r, req, healthy)
	case kindToken:
		return p.token(w, r, req, healthy)
	case kindRegister:
		return p.register(w, r, req, healthy)
	}
	if !healthy {
		unreachable(w, "%s of %s is not possible offline", req.Verb, describe(req, r))
		return servedRefused
	}
	p.reverse.ServeHTTP(w, r)
	return servedUpstream
}

func describe(req request, r *http.Request) string {
	if !req.IsResource {
		return r.URL.Path
	}
	s := req.GVR.Resource
	if req.Subresource != "" {
		s += "/" + req.Subresource
	}
	if req.Name != "" {
		s += " " + req.Name
		if req.Namespace != "" {
			s += " in namespace " + req.Namespace
		}
	}
	return s
}

func (p *Proxy) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return
	}
	p.up.Kick()
	p.log.Debug("request to the apiserver failed", "method", r.Method, "path", r.URL.Path, "err", err)
	unreachable(w, "%v", err)
}

// Ready is nil while a cloud apiserver is healthy, or, offline, while the
// cache has something to serve.
func (p *Proxy) Ready() error {
	if p.up.Healthy() {
		return nil
	}
	if !p.store.Empty() {
		return nil // offline, serving from the cache
	}
	return errors.New("no cloud apiserver is healthy and the cache is empty")
}

// Status reports the proxy's state, its part of /status (without the
// servers: the upstreams' Status).
func (p *Proxy) Status() statusapi.APIServer {
	return statusapi.APIServer{Healthy: p.up.Healthy(), QueuedWrites: p.queue.Len(), CachedObjects: p.store.Stats(), QueueLedger: p.queue.Ledger()}
}

// countingTransport counts request and response body bytes.
type countingTransport struct {
	rt http.RoundTripper
	m  *metrics
}

func (t *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil && r.Body != http.NoBody {
		r = r.Clone(r.Context())
		r.Body = &countingReader{ReadCloser: r.Body, c: t.m.bytesUp}
	}
	resp, err := t.rt.RoundTrip(r)
	if err != nil || resp.StatusCode == http.StatusSwitchingProtocols {
		return resp, err // an upgraded body must stay an io.ReadWriteCloser
	}
	resp.Body = &countingReader{ReadCloser: resp.Body, c: t.m.bytesDown}
	return resp, nil
}

// hopHeaders are not forwarded (RFC 9110, 7.6.1).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// answerFor says who reads an upstream answer: the client alone, or the
// cache too (which needs a body it can read, captured once relayed).
type answerFor bool

const (
	clientOnly     answerFor = false
	clientAndCache answerFor = true
)

// upstreamRequest is r for the current apiserver, with the node's identity
// (the client's Authorization is dropped). When the answer is for the
// cache too, it asks for a body the cache can read: uncompressed on the wire
// to the client (the transport asks for gzip and inflates it), in
// protobuf if the client takes it and the proxy can read gv's protobuf,
// else in JSON.
func (p *Proxy) upstreamRequest(r *http.Request, body []byte, to answerFor, gv schema.GroupVersion) *http.Request {
	srv, _ := p.up.Server()
	out := r.Clone(r.Context())
	out.URL = &url.URL{Scheme: srv.Scheme, Host: srv.Host, Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
	out.Host = ""
	out.RequestURI = ""
	for _, c := range r.Header.Values("Connection") {
		out.Header.Del(c)
	}
	for _, h := range hopHeaders {
		out.Header.Del(h)
	}
	out.Header.Del("Authorization")
	if to == clientAndCache {
		out.Header.Del("Accept-Encoding")
		if !keepsProtobuf(r, gv) {
			out.Header.Set("Accept", "application/json")
		}
	}
	if body != nil {
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.ContentLength = int64(len(body))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	}
	return out
}

// copyHeader copies response headers, without hop-by-hop ones.
func copyHeader(dst, src http.Header) {
	for k, vv := range src {
		if slices.Contains(hopHeaders, k) {
			continue
		}
		dst[k] = append(dst[k][:0], vv...)
	}
}
