package edgeservice

import (
	"context"
	"log/slog"
	"net/netip"
	"time"

	"k8s.io/utils/clock"

	"github.com/tether-edge/tether/edgeproxy/edgetunnel"
	"github.com/tether-edge/tether/netrules"
)

// NodeSource knows this node's pod ranges and InternalIP addresses
// (nodepods.Pods); ok is false until they are known.
type NodeSource interface {
	PodRanges
	InternalIPs() ([]netip.Addr, bool)
}

// Resync intervals of the host's rules: until the node's pod ranges are
// known, then after. Each Apply compares the rules with the kernel and
// writes only when they differ (someone's edit, a changed pod range).
const (
	resyncUnknown = time.Second
	resyncKnown   = 30 * time.Second
)

// Reconciler keeps the host's rules (netrules.EdgeRules) redirecting
// this node's pods' connections to the marked Services of Index to the
// listener's port: on each change of the index (Changed), on a resync
// timer, and once more at the start. Run removes the rules when it
// ends.
type Reconciler struct {
	Rules      netrules.EdgeRules
	Node       NodeSource
	Index      *Index
	ListenPort uint16
	// Changed receives when the index changed.
	Changed <-chan struct{}
	// LocalAddrs are used when the Node has no InternalIP: the first
	// global unicast address of each family. Default
	// edgetunnel.InterfaceAddrs.
	LocalAddrs edgetunnel.AddrSource
	Clock      clock.WithTicker // default the real clock
	Logger     *slog.Logger

	metrics *metrics
	// applied, if set, is told of each Apply's result (tests).
	applied func(netrules.EdgeDesired, error)
}

// Run reconciles until ctx ends, then removes the rules.
func (r *Reconciler) Run(ctx context.Context) error {
	clk := r.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	log := r.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if r.LocalAddrs == nil {
		r.LocalAddrs = edgetunnel.InterfaceAddrs{}
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := r.Rules.Cleanup(cctx); err != nil {
			log.Warn("service rules: cannot remove them", "backend", r.Rules.Backend(), "err", err)
		}
	}()
	var failing bool
	for {
		d, known := r.desired()
		err := r.Rules.Apply(ctx, d)
		if r.applied != nil {
			r.applied(d, err)
		}
		if r.metrics != nil {
			result := "ok"
			if err != nil {
				result = "error"
			}
			r.metrics.rules.WithLabelValues(result).Inc()
		}
		switch {
		case err != nil && ctx.Err() == nil && !failing:
			log.Error("service rules: cannot redirect this node's pods to the marked Services; retrying every second", "backend", r.Rules.Backend(), "err", err)
			failing = true
		case err != nil && ctx.Err() == nil:
			log.Debug("service rules: still failing", "backend", r.Rules.Backend(), "err", err)
		case err == nil && failing:
			log.Info("service rules: applied again", "backend", r.Rules.Backend())
			failing = false
		}
		wait := resyncKnown
		if !known || err != nil {
			wait = resyncUnknown
		}
		t := clk.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-r.Changed:
			t.Stop()
		case <-t.C():
		}
	}
}

// desired is the rules' state now; known is false while the node's pod
// ranges or addresses are not known yet.
func (r *Reconciler) desired() (netrules.EdgeDesired, bool) {
	d := netrules.EdgeDesired{Services: r.Index.Destinations(), ListenPort: r.ListenPort}
	ranges, ok1 := r.Node.PodRanges()
	addrs, ok2 := r.Node.InternalIPs()
	d.PodNets = ranges
	d.NodeAddrs = addrs
	if len(addrs) == 0 {
		// No InternalIP: this host's own addresses.
		if local, err := r.LocalAddrs.Addrs(); err == nil {
			for _, a := range local {
				if a.IsGlobalUnicast() {
					d.NodeAddrs = append(d.NodeAddrs, a)
				}
			}
		}
	}
	return d, ok1 && ok2
}
