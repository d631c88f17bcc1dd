// Package edgeservices connects edge pods to the cloud Services an
// operator marked for edge access (annotation tether.io/edge-access).
//
// An edge asks on a stream it opens (tunnel.ServiceRequest) for a Service
// by namespace, name and port, never by address. The gateway answers only
// for a Service marked for that port, and dials only a ready endpoint of
// it that lies on a cloud node: an address of a cloud Node or in its pod
// range, or in --edge-service-cidrs (an endpoint on an edge node never),
// never an edge's address or pod range, the
// gateway host's, loopback, link-local (the metadata service) or
// multicast. So a stolen node key reaches the endpoints of marked
// Services and nothing else in the VPC, however it steers the
// EndpointSlices its own pods appear in. Each edge has at most
// Options.MaxPerEdge such connections open and opens at most
// Options.PerSecond a second (a burst of as many).
package edgeservices

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/tunnel"
)

// More refusal reasons, of the edge's budget.
const (
	ReasonRate = "rate" // the edge opened more than PerSecond a second
	ReasonBusy = "busy" // the edge has MaxPerEdge connections open
)

// Defaults of Options.
const (
	DefaultMaxPerEdge  = 256
	DefaultPerSecond   = 1000
	DefaultDialTimeout = 5 * time.Second
)

// Options configure a Handler.
type Options struct {
	// Client reads Services and EndpointSlices.
	Client kubernetes.Interface
	// Snapshot returns the node watcher's latest snapshot.
	Snapshot func() *nodewatch.Snapshot
	// Mode is the gateway's address mode (which routes Snapshot holds).
	Mode nodewatch.Mode
	// Local returns the gateway host's addresses; nil means none.
	Local func() []netip.Addr
	// Denied are ranges never dialled (--edge-cidrs); Extra more ranges
	// cloud endpoints may lie in (--edge-service-cidrs; Eligibility).
	Denied, Extra []netip.Prefix
	// MaxPerEdge bounds an edge's open connections; PerSecond the
	// connections it opens a second. Zero takes the defaults.
	MaxPerEdge int
	PerSecond  float64
	// DialTimeout bounds one dial; zero takes the default.
	DialTimeout time.Duration
	// Dial dials an endpoint; nil uses a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Logger receives the handler's logs; nil discards them.
	Logger *slog.Logger
	// Registerer gets the metrics; nil registers none.
	Registerer prometheus.Registerer
}

// Handler answers the edges' service requests.
type Handler struct {
	o   Options
	log *slog.Logger
	*metrics
	factory  informers.SharedInformerFactory
	services listersv1.ServiceLister
	slices   cache.Indexer
	synced   []cache.InformerSynced

	mu    sync.Mutex
	edges map[string]*budget // by node
}

// budget is one edge's share.
type budget struct {
	open    int
	limiter *rate.Limiter
}

const byService = "service"

// New returns a Handler; Run starts its informers.
func New(o Options) (*Handler, error) {
	if o.Client == nil || o.Snapshot == nil {
		return nil, errors.New("edgeservices: Client and Snapshot are required")
	}
	o.MaxPerEdge = cmp.Or(o.MaxPerEdge, DefaultMaxPerEdge)
	o.PerSecond = cmp.Or(o.PerSecond, DefaultPerSecond)
	o.DialTimeout = cmp.Or(o.DialTimeout, DefaultDialTimeout)
	if o.Dial == nil {
		o.Dial = (&net.Dialer{}).DialContext
	}
	m, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, err
	}
	h := &Handler{o: o, log: cmp.Or(o.Logger, slog.New(slog.DiscardHandler)), metrics: m, edges: map[string]*budget{}}
	h.factory = informers.NewSharedInformerFactoryWithOptions(o.Client, 10*time.Minute,
		informers.WithTransform(func(obj any) (any, error) {
			if a, err := meta.Accessor(obj); err == nil {
				a.SetManagedFields(nil)
			}
			return obj, nil
		}))
	svc := h.factory.Core().V1().Services()
	sl := h.factory.Discovery().V1().EndpointSlices().Informer()
	if err := sl.AddIndexers(cache.Indexers{byService: func(obj any) ([]string, error) {
		s, ok := obj.(*discoveryv1.EndpointSlice)
		if !ok || s.Labels[discoveryv1.LabelServiceName] == "" {
			return nil, nil
		}
		return []string{s.Namespace + "/" + s.Labels[discoveryv1.LabelServiceName]}, nil
	}}); err != nil {
		return nil, fmt.Errorf("edgeservices: index EndpointSlices: %w", err)
	}
	h.services, h.slices = svc.Lister(), sl.GetIndexer()
	h.synced = []cache.InformerSynced{svc.Informer().HasSynced, sl.HasSynced}
	return h, nil
}

// Run runs the informers until ctx ends.
func (h *Handler) Run(ctx context.Context) error {
	h.factory.Start(ctx.Done())
	<-ctx.Done()
	h.factory.Shutdown()
	return nil
}

// HasSynced reports whether the informers have listed everything once.
func (h *Handler) HasSynced() bool {
	for _, s := range h.synced {
		if !s() {
			return false
		}
	}
	return true
}

// Connect answers req from sender, the node named by the edge's verified
// client certificate: an open connection to an endpoint of the Service
// and an OK reply, or no connection and a refusal. The caller relays and
// then calls done; done must be called exactly once when conn is not
// nil, and is nil otherwise.
func (h *Handler) Connect(ctx context.Context, sender string, req tunnel.ServiceRequest) (conn net.Conn, rep tunnel.Reply, done func()) {
	log := h.log.With("node", sender, "service", req.String())
	if !h.take(sender) {
		return nil, h.refuse(log, ReasonBusy, tunnel.Reply{Code: tunnel.Overloaded,
			Message: fmt.Sprintf("%d connections of this node to cloud Services are open", h.o.MaxPerEdge)}), nil
	}
	release := sync.OnceFunc(func() { h.release(sender) })
	if !h.allow(sender) {
		release()
		return nil, h.refuse(log, ReasonRate, tunnel.Reply{Code: tunnel.RateLimited,
			Message: fmt.Sprintf("more than %g new connections a second to cloud Services", h.o.PerSecond)}), nil
	}
	if !h.HasSynced() {
		release()
		return nil, h.answer(tunnel.Reply{Code: tunnel.NoEndpoints, Message: "this gateway replica has not read the Services yet"}), nil
	}
	svc, _ := h.services.Services(req.Namespace).Get(req.Name)
	sp, why := markedPort(svc, req.Port)
	if why != "" {
		release()
		return nil, h.refuse(log, ReasonNotMarked, replyFor(ReasonNotMarked, why)), nil
	}
	objs, _ := h.slices.ByIndex(byService, req.Namespace+"/"+req.Name)
	list := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			list = append(list, s)
		}
	}
	var local []netip.Addr
	if h.o.Local != nil {
		local = h.o.Local()
	}
	eps, reason, why := endpoints(sp, list, Eligibility{Snap: h.o.Snapshot(), Mode: h.o.Mode, Local: local, Denied: h.o.Denied, Extra: h.o.Extra})
	if reason != "" {
		release()
		return nil, h.refuse(log, reason, replyFor(reason, why)), nil
	}
	// A random endpoint, then one more on a dial failure.
	rand.Shuffle(len(eps), func(i, j int) { eps[i], eps[j] = eps[j], eps[i] })
	var err error
	for _, ep := range eps[:min(2, len(eps))] {
		dctx, cancel := context.WithTimeout(ctx, h.o.DialTimeout)
		conn, err = h.o.Dial(dctx, "tcp", ep.String())
		cancel()
		if err == nil {
			log.Debug("connected an edge pod to a cloud Service", "endpoint", ep)
			h.open.Inc()
			return conn, h.answer(tunnel.Reply{Code: tunnel.OK}), func() { h.open.Dec(); release() }
		}
		log.Debug("dial a Service endpoint", "endpoint", ep, "err", err)
	}
	release()
	return nil, h.answer(tunnel.Reply{Code: tunnel.DialFailed, Message: err.Error()}), nil
}

func (h *Handler) answer(r tunnel.Reply) tunnel.Reply {
	h.streams.WithLabelValues(r.Code.String()).Inc()
	return r
}

func (h *Handler) refuse(log *slog.Logger, reason string, r tunnel.Reply) tunnel.Reply {
	h.refusals.WithLabelValues(reason).Inc()
	log.Debug("refused an edge pod's connection to a cloud Service", "reason", reason, "why", r.Message)
	return h.answer(r)
}

// take counts a connection of node against its budget, if there is room.
func (h *Handler) take(node string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := h.edges[node]
	if b == nil {
		b = &budget{limiter: rate.NewLimiter(rate.Limit(h.o.PerSecond), max(int(h.o.PerSecond), 1))}
		h.edges[node] = b
	}
	if b.open >= h.o.MaxPerEdge {
		return false
	}
	b.open++
	return true
}

func (h *Handler) allow(node string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.edges[node].limiter.Allow()
}

func (h *Handler) release(node string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if b := h.edges[node]; b != nil {
		if b.open--; b.open <= 0 && b.limiter.Tokens() >= float64(b.limiter.Burst()) {
			delete(h.edges, node)
		}
	}
}
