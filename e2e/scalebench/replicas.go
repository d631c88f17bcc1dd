package main

import (
	"context"
	"errors"
	"time"

	"github.com/tether-edge/tether/e2e/benchkit"
)

// replicaResult is the replicas phase.
type replicaResult struct {
	edges   int
	back    regResult // the restarted replica getting every edge again
	routing routeResult
}

// replicas makes the edges dial three gateway replicas, then kills one
// with SIGKILL and starts it again while routing runs through another:
// the others keep serving, so no request should fail.
func (b *bench) replicas(ctx context.Context, res *results) error {
	if len(b.w.Gateways) < 3 || b.gws[0] == nil {
		return errors.New("no three gateway hosts, or no gateway running")
	}
	m := b.o.replicaEdges
	targets := b.all[:m]
	r := &replicaResult{edges: m}
	res.replicas = r
	note("replicas: %d edges dial 3 replicas (gw1 restarts, routing through gw2)", m)
	if err := b.agent.stop(ctx, b.all); err != nil {
		return err
	}
	for i := 1; i < 3; i++ {
		if _, err := b.startGateway(ctx, i); err != nil {
			return err
		}
	}
	gws := []string{b.gatewayAddr(0), b.gatewayAddr(1), b.gatewayAddr(2)}
	if err := b.agent.start(ctx, targets, gws...); err != nil {
		return err
	}
	for i := range 3 {
		if err := b.waitCount(ctx, b.gws[i], m, b.o.registerWait); err != nil {
			return err
		}
	}
	b.w.RouteVia(b.s, edgeCIDRs, b.w.Gateways[1])
	defer b.w.RouteVia(b.s, edgeCIDRs, b.w.Gateways[0])
	if err := b.route.warmUp(ctx, targets[0]); err != nil {
		return err
	}

	stop := make(chan struct{})
	done := make(chan routeResult, 1)
	go func() { done <- b.route.load(ctx, targets, b.o.routeConc, 0, stop) }()
	if err := benchkit.Sleep(ctx, 5*time.Second); err != nil {
		close(stop)
		return err
	}
	note("replicas: kill -9 gw1 and start it again, routing through gw2 meanwhile")
	if err := b.killGateway(0); err != nil {
		close(stop)
		return err
	}
	g, err := b.startGateway(ctx, 0)
	if err != nil {
		close(stop)
		return err
	}
	r.back = b.waitRegistered(ctx, g, m, "replicas")
	err = benchkit.Sleep(ctx, 5*time.Second)
	close(stop)
	r.routing = <-done
	note("replicas: gw1 had %d/%d edges again after %v; routing through gw2 meanwhile: %d requests, %d failed, p99 %s ms",
		r.back.reached, m, r.back.took.Round(100*time.Millisecond), r.routing.reqs, r.routing.errs, ms(r.routing.p(99)))
	return err
}
