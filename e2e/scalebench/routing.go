package main

import (
	"context"
	"crypto/x509"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/e2e/world"
)

// routeClient makes HTTPS GETs from the cloud client host to edges'
// kubelet addresses, as make bench-tunnel's client does: a new TCP
// connection and TLS handshake per request, trusting only the stand-in
// kubelets' CA, whose certificate for the edge's address proves the
// request went end to end to the right edge.
type routeClient struct{ c *http.Client }

func newRouteClient(dial benchkit.DialFunc, roots *x509.CertPool) *routeClient {
	return &routeClient{c: benchkit.NewConnClient(dial, roots, 10*time.Second)}
}

// get fetches /healthz of edge i.
func (c *routeClient) get(ctx context.Context, i int) error {
	_, err := benchkit.Get(ctx, c.c, fmt.Sprintf("https://%s:%d/healthz", edgeAddr(i), world.KubeletPort))
	return err
}

// routeResult is one routing measurement.
type routeResult struct {
	edges    int // the random targets were among this many edges
	reqs     int
	errs     int
	firstErr error
	elapsed  time.Duration
	lat      []time.Duration // sorted
}

func (r routeResult) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.reqs) / r.elapsed.Seconds()
}

func (r routeResult) p(q float64) time.Duration { return benchkit.Pct(r.lat, q) }

// load sends GETs to random edges among targets from conc clients until
// stop is closed or d passes (d 0: only stop), and reports.
func (c *routeClient) load(ctx context.Context, targets []int, conc int, d time.Duration, stop <-chan struct{}) routeResult {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if d > 0 {
		var c2 context.CancelFunc
		ctx, c2 = context.WithTimeout(ctx, d)
		defer c2()
	}
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	r := routeResult{edges: len(targets)}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := targets[rand.N(len(targets))]
				t0 := time.Now()
				err := c.get(ctx, i)
				took := time.Since(t0)
				if ctx.Err() != nil {
					return // cut short by the end: not counted
				}
				mu.Lock()
				if err != nil {
					r.errs++
					if r.firstErr == nil {
						r.firstErr = err
					}
				} else {
					r.reqs++
					r.lat = append(r.lat, took)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	r.elapsed = time.Since(start)
	slices.Sort(r.lat)
	return r
}

// warmUp retries GETs to edge i until one succeeds (the gateway has
// applied the node's DNAT and the edge's tunnel is up), for up to 60 s.
func (c *routeClient) warmUp(ctx context.Context, i int) error {
	deadline := time.Now().Add(time.Minute)
	for {
		err := c.get(ctx, i)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("edge %s not reachable through the gateway within a minute: %w", edgeName(i), err)
		}
		if err := benchkit.Sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// measureRoute runs the warm-up and one measurement over targets.
func (b *bench) measureRoute(ctx context.Context, targets []int, label string) (routeResult, error) {
	for _, i := range []int{targets[0], targets[len(targets)-1]} {
		if err := b.route.warmUp(ctx, i); err != nil {
			return routeResult{}, err
		}
	}
	b.route.load(ctx, targets, b.o.routeConc, 2*time.Second, nil) // code paths, caches
	note("routing: %s: %d clients for %v", label, b.o.routeConc, b.o.route)
	if b.gws[0] != nil {
		b.profile(ctx, b.gws[0], "routing-"+label, b.o.route)
	}
	r := b.route.load(ctx, targets, b.o.routeConc, b.o.route, nil)
	note("routing: %s: %d requests, %.0f/s, p50 %s ms, p99 %s ms, %d failed", label, r.reqs, r.rate(), ms(r.p(50)), ms(r.p(99)), r.errs)
	return r, nil
}

// routeTurnLength is how long one turn of routeTurns sends to one side.
const routeTurnLength = time.Second

// routeTurns measures routing with every edge connected against routing
// with one edge connected, in turns under the same load: edge-1 also
// dials a second replica, which has it alone, and the client reaches
// edge-1 through that replica and the other edges through the fleet's.
// Measured one after the other, the two figures differed as much by
// what else the machine was doing then (the load generator's 10,000
// edges share its two cores) as by the fleet the gateway serves; taking
// turns every second leaves only the latter. Each side gets --route in
// all. The second replica is stopped and edge-1 dials the first alone
// again at the end.
func (b *bench) routeTurns(ctx context.Context) (all, one routeResult, err error) {
	first, rest := b.all[0], b.all[1:]
	note("routing: %s also dials %s, a replica that has it alone", edgeName(first), b.w.Gateways[1].Label)
	if err := b.agent.stop(ctx, []int{first}); err != nil {
		return all, one, err
	}
	g1, err := b.startGateway(ctx, 1)
	if err != nil {
		return all, one, err
	}
	defer func() {
		// Best effort: the route may not have been added yet.
		_ = b.w.Client.Command(context.Background(), "ip", "route", "del", netip.PrefixFrom(edgeAddr(first), 32).String()).Run()
		if stopErr := b.stopGateway(1); err == nil {
			err = stopErr
		}
		if startErr := b.agent.start(ctx, []int{first}, b.gatewayAddr(0)); err == nil {
			err = startErr
		}
	}()
	if err := b.agent.start(ctx, []int{first}, b.gatewayAddr(0), b.gatewayAddr(1)); err != nil {
		return all, one, err
	}
	if err := b.waitCount(ctx, g1, 1, b.o.registerWait); err != nil {
		return all, one, err
	}
	if err := b.waitCount(ctx, b.gws[0], b.o.edges, b.o.registerWait); err != nil {
		return all, one, err
	}
	b.w.RouteVia(b.s, netip.PrefixFrom(edgeAddr(first), 32), b.w.Gateways[1])
	for _, i := range []int{first, rest[0], rest[len(rest)-1]} {
		if err := b.route.warmUp(ctx, i); err != nil {
			return all, one, err
		}
	}
	// Code paths and caches, both sides.
	b.route.load(ctx, []int{first}, b.o.routeConc, 2*time.Second, nil)
	b.route.load(ctx, rest, b.o.routeConc, 2*time.Second, nil)
	label := fmt.Sprintf("%d edges", b.o.edges)
	note("routing: %s and 1 edge (%s) in turns of %v, %v each, %d clients", label, g1.host.Label, routeTurnLength, b.o.route, b.o.routeConc)
	b.profile(ctx, b.gws[0], "routing-"+strings.ReplaceAll(label, " ", "-"), 2*b.o.route)
	all, one = routeResult{edges: len(b.all)}, routeResult{edges: 1}
	for turn := 0; all.elapsed < b.o.route || one.elapsed < b.o.route; turn++ {
		if ctx.Err() != nil {
			return all, one, ctx.Err()
		}
		if turn%2 == 0 {
			all.add(b.route.load(ctx, rest, b.o.routeConc, routeTurnLength, nil))
		} else {
			one.add(b.route.load(ctx, []int{first}, b.o.routeConc, routeTurnLength, nil))
		}
	}
	slices.Sort(all.lat)
	slices.Sort(one.lat)
	for _, x := range []struct {
		label string
		r     routeResult
	}{{label, all}, {"1 edge beside them", one}} {
		note("routing: %s: %d requests, %.0f/s, p50 %s ms, p99 %s ms, %d failed", x.label, x.r.reqs, x.r.rate(), ms(x.r.p(50)), ms(x.r.p(99)), x.r.errs)
	}
	return all, one, nil
}

// add merges x, a turn, into r; r's latencies are sorted again by the
// caller.
func (r *routeResult) add(x routeResult) {
	r.reqs += x.reqs
	r.errs += x.errs
	if r.firstErr == nil {
		r.firstErr = x.firstErr
	}
	r.elapsed += x.elapsed
	r.lat = append(r.lat, x.lat...)
}
