package edgeservice

import (
	"context"
	"errors"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/netrules"
)

// Feature is the whole of the edge's access to marked cloud Services:
// the Service informer, the index of marked ClusterIPs, the host's rules
// and the listener.
type Feature struct {
	services *Services
	index    *Index
	rules    *Reconciler
	server   *Server
	ln       net.Listener
	changed  chan struct{}
	log      *slog.Logger
}

// FeatureOptions configure NewFeature.
type FeatureOptions struct {
	Services *Services
	Node     NodeSource
	Dialer   Dialer
	Rules    netrules.EdgeRules
	// Listener is the service listener, bound on the wildcard address.
	Listener net.Listener
	Logger   *slog.Logger
	Registry prometheus.Registerer
}

// NewFeature builds the feature; Run runs it.
func NewFeature(o FeatureOptions) (*Feature, error) {
	tcp, ok := o.Listener.Addr().(*net.TCPAddr)
	if !ok || tcp.Port == 0 {
		return nil, errors.New("service listener: not a bound TCP listener")
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	f := &Feature{services: o.Services, index: &Index{}, ln: o.Listener, changed: make(chan struct{}, 1), log: o.Logger}
	srv, err := New(Options{Index: f.index, Dialer: o.Dialer, Pods: o.Node, Logger: o.Logger, Registry: o.Registry})
	if err != nil {
		return nil, err
	}
	f.server = srv
	f.rules = &Reconciler{Rules: o.Rules, Node: o.Node, Index: f.index, ListenPort: uint16(tcp.Port),
		Changed: f.changed, Logger: o.Logger, metrics: srv.metrics}
	return f, nil
}

// Run runs the informer, keeps the index and the rules up to date and
// serves the listener until ctx ends; the rules are then removed.
func (f *Feature) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	f.services.Start(gctx)
	g.Go(func() error {
		<-gctx.Done()
		f.services.Shutdown()
		return nil
	})
	g.Go(func() error {
		if !cache.WaitForCacheSync(gctx.Done(), f.services.HasSynced) {
			return nil
		}
		for {
			if f.index.Set(f.services.List()) {
				f.log.Debug("marked Services changed", "destinations", len(f.index.Destinations()))
				select {
				case f.changed <- struct{}{}:
				default:
				}
			}
			select {
			case <-gctx.Done():
				return nil
			case <-f.services.Changed():
			}
		}
	})
	g.Go(func() error { return f.rules.Run(gctx) })
	g.Go(func() error { return f.server.Serve(gctx, f.ln) })
	return g.Wait()
}

// Close closes the listener, for a feature built but never run.
func (f *Feature) Close() error { return f.ln.Close() }

// Ready reports whether the marked Services are known.
func (f *Feature) Ready() error {
	if !f.services.HasSynced() {
		return errors.New("marked Services not known yet")
	}
	return nil
}
