// Package dnat keeps the gateway host's DNAT rules in step with the edge
// nodes: every edge node's reach address (its InternalIP in node-ip mode,
// its VIP in vip mode) on every proxied port is redirected to the
// transparent listener.
//
// Node snapshots arrive from the node watcher (Update, which never blocks);
// one goroutine (Run) applies the newest one whenever it changes and again
// on every resync tick, so drift — someone flushing the table — is repaired
// within a resync period. netrules does the work; this package decides
// what is wanted and when. In vip mode it also assigns VIPs (recording
// them on the Node, so every replica agrees) and holds them on tether0.
package dnat

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/netrules"
)

// Options configure a Reconciler.
type Options struct {
	Rules     netrules.Rules
	Mode      nodewatch.Mode
	Ports     []uint16 // proxied edge ports, e.g. 10250, 10255
	ProxyPort uint16   // the transparent listener
	// Resync re-applies the rules this often, repairing drift. Default 30 s.
	Resync time.Duration
	// CleanupOnExit removes the rules (and the VIP link) when Run returns.
	CleanupOnExit bool
	// VIPs assigns and holds virtual addresses; required in vip mode.
	VIPs       *VIPs
	Clock      clock.WithTicker
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Reconciler applies the desired rules for the newest node snapshot.
type Reconciler struct {
	o      Options
	log    *slog.Logger
	latest atomic.Pointer[nodewatch.Snapshot]
	kick   chan struct{}
	ready  atomic.Bool

	*metrics
}

// New returns a Reconciler; call Run to start it.
func New(o Options) (*Reconciler, error) {
	if o.Rules == nil {
		return nil, errors.New("dnat: no rules backend")
	}
	if o.Mode == nodewatch.ModeVIP && o.VIPs == nil {
		return nil, errors.New("dnat: vip mode needs a VIP assigner")
	}
	if o.Resync <= 0 {
		o.Resync = 30 * time.Second
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Reconciler{
		o:    o,
		log:  o.Logger.With("backend", o.Rules.Backend()),
		kick: make(chan struct{}, 1),
	}
	var err error
	if r.metrics, err = newMetrics(o.Registerer); err != nil {
		return nil, fmt.Errorf("register netrules metrics: %w", err)
	}
	return r, nil
}

// Update hands the reconciler a new snapshot. It never blocks: snapshots
// that arrive while an apply runs are coalesced into the newest.
func (r *Reconciler) Update(s *nodewatch.Snapshot) {
	r.latest.Store(s)
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Ready reports whether the rules for a snapshot have been applied.
func (r *Reconciler) Ready() bool { return r.ready.Load() }

// Run applies rules until ctx ends, then removes them if CleanupOnExit.
func (r *Reconciler) Run(ctx context.Context) error {
	tick := r.o.Clock.NewTicker(r.o.Resync)
	defer tick.Stop()
	defer r.cleanup()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
		case <-tick.C():
		}
		if s := r.latest.Load(); s != nil {
			r.apply(ctx, s)
		}
	}
}

// apply makes the host's rules match s. A failure is logged and counted;
// the next kick or tick tries again (netrules does a full resync then).
func (r *Reconciler) apply(ctx context.Context, s *nodewatch.Snapshot) {
	if r.o.Mode == nodewatch.ModeVIP {
		if err := r.o.VIPs.Sync(ctx, s); err != nil {
			r.log.Error("assign virtual addresses", "err", err)
		}
	}
	d := r.desired(s)
	start := r.o.Clock.Now()
	err := r.o.Rules.Apply(ctx, d)
	r.duration.Observe(r.o.Clock.Since(start).Seconds())
	if err != nil {
		r.applies.WithLabelValues("error").Inc()
		r.log.Error("apply DNAT rules", "edges", len(d.Edges), "err", err)
		return
	}
	r.applies.WithLabelValues("ok").Inc()
	r.edges.Set(float64(len(d.Edges)))
	if !r.ready.Swap(true) {
		r.log.Info("DNAT rules in place", "edges", len(d.Edges), "ports", d.Ports, "proxy-port", d.ProxyPort)
	}
	r.log.Debug("DNAT rules applied", "edges", len(d.Edges), "took", r.o.Clock.Since(start))
	r.flushConntrack(ctx)
}

// flushConntrack deletes, once the new rules are in place, the conntrack
// entries of connections they no longer redirect, so that no established
// flow to a removed node keeps reaching the listener. A failure is logged:
// the rules are right, and a later flush does not retry it.
func (r *Reconciler) flushConntrack(ctx context.Context) {
	start := r.o.Clock.Now()
	if err := r.o.Rules.FlushConntrack(ctx); err != nil {
		r.log.Warn("flush conntrack of destinations no longer redirected", "err", err)
		return
	}
	r.log.Debug("conntrack flushed", "took", r.o.Clock.Since(start))
}

// desired is the rule set for s: each edge node's routed addresses, and
// nothing the snapshot's Routes refuse (an address of a cloud node or of
// the gateway host, one two edges claim, one outside the edge ranges).
func (r *Reconciler) desired(s *nodewatch.Snapshot) netrules.Desired {
	d := netrules.Desired{
		Edges:     make(map[string][]netip.Addr),
		Ports:     r.o.Ports,
		ProxyPort: r.o.ProxyPort,
	}
	routes := s.Routing(r.o.Mode)
	for _, name := range slices.Sorted(maps.Keys(s.Nodes)) {
		if addrs := routes.Of(name); len(addrs) > 0 {
			d.Edges[name] = addrs
		}
	}
	// Pod ranges (nodewatch.ResolvePods), on every TCP port: the edge
	// decides which of its pods' ports it dials.
	if pods := s.Pods.ByNode(); len(pods) > 0 {
		d.PodRanges = pods
	}
	return d
}

func (r *Reconciler) cleanup() {
	if !r.o.CleanupOnExit {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.o.Rules.Cleanup(ctx); err != nil {
		r.log.Error("remove DNAT rules", "err", err)
	} else {
		r.log.Info("DNAT rules removed")
	}
	if r.o.VIPs != nil {
		if err := r.o.VIPs.Cleanup(); err != nil {
			r.log.Error("remove virtual addresses", "err", err)
		}
	}
}
