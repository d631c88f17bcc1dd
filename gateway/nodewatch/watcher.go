// Package nodewatch is the gateway's view of the cluster's Nodes: one
// client-go informer on Nodes that publishes immutable Snapshots to the
// edge registry, netrules and the DNS server.
//
// Data flow: informer events update a private map of Nodes (only when a
// Node's relevant data changed) and wake one publisher goroutine, which
// copies the map into a new Snapshot, stores it for Snapshot() and hands it
// to every subscriber in order. A burst of events (the initial list, a
// relist) is coalesced into a few snapshots rather than one per event.
// Nothing is published before the informer has synced.
//
// Each snapshot carries the routing decision (Routes, see Resolve): which
// edge node each address reaches. The publisher resolves it from the new
// Nodes (an address several edges claim goes to the one that registered
// with it, else to none), the previous decision (read in vip mode only: a
// VIP stays with the node that held it first) and the gateway host's own
// addresses, which it reads again on every publish and every
// HostCheckEvery. New refusals are logged once and
// counted by reason.
package nodewatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Options configure a Watcher.
type Options struct {
	// EdgeSelector tells edge nodes from cloud nodes; nil means
	// DefaultEdgeSelector (openyurt.io/is-edge-worker=true).
	EdgeSelector labels.Selector
	// Logger receives the watcher's logs; nil discards them.
	Logger *slog.Logger
	// ResyncPeriod is the informer's resync period; 0 disables resyncs.
	// A resync that changes nothing publishes nothing.
	ResyncPeriod time.Duration
	// Policy decides which addresses edge nodes may be reached at (mode,
	// ranges); the zero Policy is node-ip mode with no range limit.
	Policy Policy
	// PodPolicy decides which pod ranges of edge nodes are routed; the
	// zero PodPolicy routes none.
	PodPolicy PodPolicy
	// GatewayHost returns the gateway host's own addresses, which are
	// never routed to an edge; nil skips that check (tests on loopback).
	GatewayHost func() ([]netip.Addr, error)
	// HostCheckEvery is how often GatewayHost is read again between
	// publishes (an address added to the host later). Default 30 s.
	HostCheckEvery time.Duration
}

// Watcher watches Nodes and publishes Snapshots.
type Watcher struct {
	client kubernetes.Interface
	edge   labels.Selector
	log    *slog.Logger
	resync time.Duration
	opts   Options

	*metrics // its address refusals; the Watcher is their Collector
	// Touched only by the publisher: the gateway host's addresses as last
	// read, and the refusals of the last published snapshot.
	local      []netip.Addr
	refused    map[Refusal]bool
	podRefused map[PodRefusal]bool

	snap   atomic.Pointer[Snapshot]
	synced chan struct{} // closed once the first snapshot is published
	kick   chan struct{} // wakes the publisher; capacity 1
	ran    atomic.Bool

	mu    sync.Mutex
	nodes map[string]Node // guarded by mu
	dirty bool            // guarded by mu: nodes changed since the last snapshot
	subs  []*subscriber   // guarded by mu
}

type subscriber struct {
	fn   func(*Snapshot)
	seen uint64 // Version last delivered; touched only by the publisher
}

// New returns a Watcher; call Run to start it.
func New(client kubernetes.Interface, opts Options) *Watcher {
	if opts.Policy.Mode == "" {
		opts.Policy.Mode = ModeNodeIP
	}
	if opts.HostCheckEvery <= 0 {
		opts.HostCheckEvery = 30 * time.Second
	}
	w := &Watcher{
		client:     client,
		edge:       opts.EdgeSelector,
		log:        opts.Logger,
		resync:     opts.ResyncPeriod,
		opts:       opts,
		synced:     make(chan struct{}),
		kick:       make(chan struct{}, 1),
		nodes:      make(map[string]Node),
		refused:    map[Refusal]bool{},
		podRefused: map[PodRefusal]bool{},
		metrics:    newMetrics(),
	}
	if w.edge == nil {
		w.edge = DefaultEdgeSelector()
	}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	w.snap.Store(&Snapshot{Nodes: map[string]Node{}, Routes: &Routes{mode: opts.Policy.Mode}})
	return w
}

// Snapshot returns the latest published snapshot; before the first sync it
// is empty (Version 0). It never returns nil.
func (w *Watcher) Snapshot() *Snapshot { return w.snap.Load() }

// WaitSynced blocks until the first complete snapshot is published or ctx
// is done.
func (w *Watcher) WaitSynced(ctx context.Context) error {
	select {
	case <-w.synced:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Subscribe registers fn to be called with every new snapshot, starting
// with the current one if the watcher has already synced. All calls, for
// all subscribers, come from one goroutine in Version order, so fn must not
// block for long: a slow subscriber delays the others (snapshots published
// meanwhile are coalesced, never queued).
func (w *Watcher) Subscribe(fn func(*Snapshot)) {
	w.mu.Lock()
	w.subs = append(w.subs, &subscriber{fn: fn})
	w.mu.Unlock()
	w.wake()
}

// Run runs the informer and the publisher until ctx is done, then returns
// nil. It may be called once.
func (w *Watcher) Run(ctx context.Context) error {
	if w.ran.Swap(true) {
		return errors.New("nodewatch: Run called twice")
	}
	inf := coreinformers.NewNodeInformer(w.client, w.resync, cache.Indexers{})
	if err := inf.SetTransform(trim); err != nil {
		return fmt.Errorf("set node transform: %w", err)
	}
	reg, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.onUpsert,
		UpdateFunc: func(_, obj any) { w.onUpsert(obj) },
		DeleteFunc: w.onDelete,
	})
	if err != nil {
		return fmt.Errorf("add node event handler: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		inf.RunWithContext(ctx)
	}()
	w.log.Info("watching nodes", "edgeSelector", w.edge.String())
	select {
	case <-reg.HasSyncedChecker().Done():
		w.publishLoop(ctx)
	case <-ctx.Done():
	}
	<-done
	return nil
}

// trim keeps only the fields Node conversion reads, so that the informer's
// cache does not hold images, conditions and managed fields of every node.
func trim(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil // a DeletedFinalStateUnknown tombstone
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:            n.Name,
			UID:             n.UID,
			ResourceVersion: n.ResourceVersion,
			Labels:          n.Labels,
			Annotations:     n.Annotations,
		},
		Spec:   corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
		Status: corev1.NodeStatus{Addresses: n.Status.Addresses},
	}, nil
}

func (w *Watcher) onUpsert(obj any) {
	o, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	n, warning := fromObject(o, w.edge)
	w.mu.Lock()
	old, had := w.nodes[n.Name]
	changed := !had || !old.Equal(n)
	if changed {
		w.nodes[n.Name] = n
		w.dirty = true
	}
	w.mu.Unlock()
	if !changed {
		return
	}
	if warning != "" {
		w.log.Warn("ignoring part of node", "node", n.Name, "reason", warning)
	}
	w.log.Debug("node changed", "node", n.Name, "edge", n.Edge, "pool", n.Pool,
		"addresses", n.InternalIPs, "vip", n.VIP, "new", !had)
	w.wake()
}

func (w *Watcher) onDelete(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	o, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	w.mu.Lock()
	_, had := w.nodes[o.Name]
	delete(w.nodes, o.Name)
	w.dirty = w.dirty || had
	w.mu.Unlock()
	if had {
		w.log.Debug("node deleted", "node", o.Name)
		w.wake()
	}
}

func (w *Watcher) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// publishLoop publishes the first snapshot at once, then one per wake-up
// with changes (of the Nodes or of the gateway host's addresses), and
// delivers the latest snapshot to subscribers that have not seen it.
func (w *Watcher) publishLoop(ctx context.Context) {
	w.wake()
	hostCheck := time.NewTicker(w.opts.HostCheckEvery)
	defer hostCheck.Stop()
	announced := false
	for {
		hostChanged := false
		select {
		case <-ctx.Done():
			return
		case <-w.kick:
			hostChanged = w.readHost()
		case <-hostCheck.C:
			if hostChanged = w.readHost(); !hostChanged {
				continue
			}
		}
		w.mu.Lock()
		snap := w.snap.Load()
		if w.dirty || hostChanged || snap.Version == 0 {
			nodes := maps.Clone(w.nodes)
			routes := Resolve(nodes, w.opts.Policy, w.local, snap.Routes)
			pods := ResolvePods(nodes, w.opts.PodPolicy, w.local, routes)
			snap = &Snapshot{Nodes: nodes, Routes: routes, Pods: pods, Version: snap.Version + 1}
			w.dirty = false
			w.snap.Store(snap)
			w.reportRefusals(routes)
			w.reportPodRefusals(pods)
		}
		subs := slices.Clone(w.subs)
		w.mu.Unlock()
		if !announced {
			announced = true
			w.log.Info("nodes synced", "nodes", len(snap.Nodes), "edge", snap.Edge())
			close(w.synced)
		}
		for _, s := range subs {
			if s.seen != snap.Version {
				s.seen = snap.Version
				s.fn(snap)
			}
		}
	}
}

// readHost reads the gateway host's addresses and reports whether they
// changed. A failure keeps the previous ones and is logged.
func (w *Watcher) readHost() bool {
	if w.opts.GatewayHost == nil {
		return false
	}
	addrs, err := w.opts.GatewayHost()
	if err != nil {
		w.log.Warn("read the gateway host's addresses; keeping the previous ones", "err", err)
		return false
	}
	if addrs == nil {
		addrs = []netip.Addr{}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	addrs = slices.Compact(addrs)
	if w.local != nil && slices.Equal(addrs, w.local) {
		return false
	}
	w.local = addrs
	return true
}

// reportRefusals logs and counts the refusals of routes that the previous
// snapshot did not have, logs the ones that ended, and sets the gauges.
func (w *Watcher) reportRefusals(routes *Routes) {
	w.refused = report(w.refused, routes.Refused(), Reasons(), w.refusalsNow, w.refusalsTotal,
		func(r Refusal) Reason { return r.Reason },
		func(r Refusal) {
			w.log.Warn("not routing an address an edge node claims", "node", r.Node, "address", r.Addr,
				"reason", string(r.Reason), "holder", r.Holder)
		},
		func(r Refusal) {
			w.log.Info("address refusal ended", "node", r.Node, "address", r.Addr, "reason", string(r.Reason))
		})
}

// reportPodRefusals does for pod ranges what reportRefusals does for
// addresses.
func (w *Watcher) reportPodRefusals(pods *PodRoutes) {
	w.podRefused = report(w.podRefused, pods.Refused(), PodReasons(), w.podRefusalsNow, w.podRefusalsTotal,
		func(r PodRefusal) Reason { return r.Reason },
		func(r PodRefusal) {
			w.log.Warn("not routing an edge node's pod range", "node", r.Node, "range", r.Prefix,
				"reason", string(r.Reason), "with", r.With)
		},
		func(r PodRefusal) {
			w.log.Info("pod range refusal ended", "node", r.Node, "range", r.Prefix, "reason", string(r.Reason))
		})
}

// report counts and logs (began) each refusal of refused that was not in
// before, logs (ended) each of before that is gone, sets the gauge per
// reason, and returns the refusals now in force.
func report[R comparable](before map[R]bool, refused []R, reasons []Reason, gauge *prometheus.GaugeVec,
	total *prometheus.CounterVec, reason func(R) Reason, began, ended func(R)) map[R]bool {
	now := make(map[R]bool, len(refused))
	counts := map[Reason]int{}
	for _, r := range refused {
		now[r] = true
		counts[reason(r)]++
		if !before[r] {
			total.WithLabelValues(string(reason(r))).Inc()
			began(r)
		}
	}
	for r := range before {
		if !now[r] {
			ended(r)
		}
	}
	for _, rs := range reasons {
		gauge.WithLabelValues(string(rs)).Set(float64(counts[rs]))
	}
	return now
}
