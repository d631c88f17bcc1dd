package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tether-edge/tether/e2e/benchkit"
)

// results are the figures of the phases that ran.
type results struct {
	edges          int
	connectedAtEnd int
	failed         error

	// routeOne: one edge on a gateway alone, before the fleet starts;
	// routeAll: random edges of the fleet, in turns with routeOneBeside:
	// one edge on a second replica, under the same load (routing.go).
	routeOne, routeAll, routeOneBeside *routeResult
	health                             []healthMark // after each phase (health.go)
	cold                               *regResult
	steady                             *steadyResult
	storm                              *stormResult
	scrape                             *scrapeResult
	hb                                 *hbPhase
	churn                              *churnResult
	replicas                           *replicaResult
}

// routeOne measures routing with one edge connected, before the cold
// start: a gateway with every Node known but only edge-1's tunnel.
func (b *bench) routeOne(ctx context.Context, res *results) error {
	note("routing: baseline, a gateway with edge-1 alone connected")
	one := []int{1}
	if err := b.agent.start(ctx, one, b.gatewayAddr(0)); err != nil {
		return err
	}
	g, err := b.startGateway(ctx, 0)
	if err != nil {
		return err
	}
	if r := b.waitRegistered(ctx, g, 1, "routing baseline"); !r.all() {
		return errors.New("edge-1 did not register")
	}
	r, err := b.measureRoute(ctx, one, "1 edge")
	if err != nil {
		return err
	}
	res.routeOne = &r
	b.markHealth(ctx, "routing-1", res)
	if err := b.stopGateway(0); err != nil {
		return err
	}
	return b.agent.stop(ctx, one)
}

// cold starts every edge and the gateway together and waits until every
// edge is registered.
func (b *bench) cold(ctx context.Context, res *results) error {
	note("cold start: %d edges dialling, gateway starting", b.o.edges)
	udp0, _ := udpDatagrams(ctx, b.w.Gateways[0])
	if err := b.agent.start(ctx, b.all, b.gatewayAddr(0)); err != nil {
		return err
	}
	g, err := b.startGateway(ctx, 0)
	if err != nil {
		return err
	}
	r := b.waitRegistered(ctx, g, b.o.edges, "cold start")
	if udp1, err := udpDatagrams(ctx, g.host); err == nil {
		r.udpDrops = udp1.rcvbufErrors - udp0.rcvbufErrors
	}
	res.cold = &r
	note("cold start: %d/%d registered in %v, peak RSS %s MiB, CPU %.1f s", r.reached, r.want, r.took.Round(100*time.Millisecond), mib(r.peakRSS), r.cpu.Seconds())
	return nil
}

// steadyResult is the steady phase.
type steadyResult struct {
	settled    bool // every edge was registered before the measurement
	settleTook time.Duration
	settleRate float64 // liveness probes/s at the end of the settling, -1 unknown
	before     int     // edges registered at its start
	connected  int     // and at its end
	took       time.Duration
	rss        int64
	cpuPct     float64 // of one core
	udpIn      float64 // datagrams per second
	udpOut     float64
	probes     float64 // liveness probes answered per second, -1 unknown
	goroutines int
	agent      agentStats
}

func (r steadyResult) perEdgeKiB() float64 {
	if r.connected == 0 {
		return 0
	}
	return float64(r.rss) / 1024 / float64(r.connected)
}

// steadyState measures the gateway with the fleet connected and nothing
// but keepalives going.
func (b *bench) steadyState(ctx context.Context, res *results) error {
	g := b.gws[0]
	if g == nil {
		return errors.New("no gateway running")
	}
	r := steadyResult{settled: true}
	if err := b.waitCount(ctx, g, b.o.edges, b.o.registerWait); err != nil {
		// Measured anyway, but not a steady fleet: edges still
		// (re)connecting cost handshakes.
		note("steady: %v; measuring anyway", err)
		r.settled = false
	}
	if err := b.settle(ctx, g, &r); err != nil {
		return err
	}
	n, err := registered(ctx, g.host)
	if err != nil {
		return err
	}
	r.before = n
	udp0, err := udpDatagrams(ctx, g.host)
	if err != nil {
		return err
	}
	probes0 := probesAnswered(ctx, g.host)
	b.profile(ctx, g, "steady", b.o.steady)
	cpu0, t0 := benchkit.CPU(g.pid), time.Now()
	stop := benchkit.Progress(ctx, 10*time.Second, func() {
		el := time.Since(t0)
		note("steady: %v/%v, RSS %s MiB, CPU %.1f%% of a core", el.Round(time.Second), b.o.steady, mib(gatewayRSS(g)),
			100*(benchkit.CPU(g.pid)-cpu0).Seconds()/el.Seconds())
	})
	err = benchkit.Sleep(ctx, b.o.steady)
	stop()
	if err != nil {
		return err
	}
	cpu1, took := benchkit.CPU(g.pid), time.Since(t0)
	udp1, err := udpDatagrams(ctx, g.host)
	if err != nil {
		return err
	}
	r.took, r.rss = took, gatewayRSS(g)
	r.cpuPct = 100 * (cpu1 - cpu0).Seconds() / took.Seconds()
	r.udpIn, r.udpOut = float64(udp1.in-udp0.in)/took.Seconds(), float64(udp1.out-udp0.out)/took.Seconds()
	r.probes = -1
	if probes1 := probesAnswered(ctx, g.host); probes0 >= 0 && probes1 >= 0 {
		r.probes = (probes1 - probes0) / took.Seconds()
	}
	if r.connected, err = registered(ctx, g.host); err != nil {
		return err
	}
	r.goroutines = goroutines(ctx, g.host)
	r.agent, _ = b.agent.stats(ctx)
	res.steady = &r
	if b.o.profileDir != "" {
		for _, p := range []struct{ path, name string }{{"/debug/pprof/heap", "steady-heap"}, {"/debug/pprof/goroutine", "steady-goroutine"}} {
			if err := b.fetchProfile(ctx, g, p.path, p.name, 30*time.Second); err != nil {
				note("profile %s: %v", p.name, err)
			}
		}
	}
	note("steady: %d edges, RSS %s MiB (%.1f KiB per edge), CPU %.1f%%, UDP %.0f in + %.0f out datagrams/s, %d goroutines",
		r.connected, mib(r.rss), r.perEdgeKiB(), r.cpuPct, r.udpIn, r.udpOut, r.goroutines)
	return nil
}

// settle waits --settle, then until the liveness probes answered fall
// under one a second per 2,000 edges, or --settle-max has passed.
func (b *bench) settle(ctx context.Context, g *gwProc, r *steadyResult) error {
	start := time.Now()
	limit := max(1, float64(b.o.edges)/2000)
	note("steady: settling %v (path MTU discovery), then until under %.0f liveness probes/s (at most %v in all)", b.o.settle, limit, b.o.settleMax)
	if err := benchkit.Sleep(ctx, b.o.settle); err != nil {
		return err
	}
	r.settleRate = -1
	prev, t0 := probesAnswered(ctx, g.host), time.Now()
	for prev >= 0 && time.Since(start) < b.o.settleMax {
		if err := benchkit.Sleep(ctx, min(10*time.Second, b.o.settleMax-time.Since(start))); err != nil {
			return err
		}
		cur, t1 := probesAnswered(ctx, g.host), time.Now()
		if cur < 0 {
			break
		}
		r.settleRate = (cur - prev) / t1.Sub(t0).Seconds()
		note("steady: settling %v: %.1f liveness probes/s", time.Since(start).Round(time.Second), r.settleRate)
		if r.settleRate < limit {
			break
		}
		prev, t0 = cur, t1
	}
	r.settleTook = time.Since(start)
	note("steady: settled in %v; %v of keepalives only", r.settleTook.Round(time.Second), b.o.steady)
	return nil
}

// routeAll measures routing to random edges of the whole fleet, taking
// turns with routing to one edge through a second replica that has only
// that edge (routing.go); with a single edge, the fleet alone.
func (b *bench) routeAll(ctx context.Context, res *results) error {
	if b.o.edges < 2 || len(b.w.Gateways) < 2 {
		r, err := b.measureRoute(ctx, b.all, fmt.Sprintf("%d edges", b.o.edges))
		if err != nil {
			return err
		}
		res.routeAll = &r
		return nil
	}
	all, one, err := b.routeTurns(ctx)
	if err != nil {
		return err
	}
	res.routeAll, res.routeOneBeside = &all, &one
	return nil
}

// stormResult is the restart storm.
type stormResult struct {
	reg      regResult
	sinceKil time.Duration // from the kill to every edge registered
	// noticed: how the edges' old connections ended meanwhile, by reason
	// (stateless_reset, idle_timeout, ...).
	noticed map[string]int64
}

// storm kills the gateway with SIGKILL, starts it again at once and waits
// until every edge is registered again.
func (b *bench) storm(ctx context.Context, res *results) error {
	if b.gws[0] == nil {
		return errors.New("no gateway running")
	}
	note("storm: kill -9 the gateway and start it again")
	udp0, _ := udpDatagrams(ctx, b.gws[0].host)
	st0, _ := b.agent.stats(ctx)
	killed := time.Now()
	if err := b.killGateway(0); err != nil {
		return err
	}
	g, err := b.startGateway(ctx, 0)
	if err != nil {
		return err
	}
	r := b.waitRegistered(ctx, g, b.o.edges, "storm")
	if udp1, err := udpDatagrams(ctx, g.host); err == nil {
		r.udpDrops = udp1.rcvbufErrors - udp0.rcvbufErrors
	}
	res.storm = &stormResult{reg: r, sinceKil: time.Since(killed), noticed: map[string]int64{}}
	if st1, err := b.agent.stats(ctx); err == nil {
		for reason, n := range st1.Disconnects {
			if d := n - st0.Disconnects[reason]; d > 0 {
				res.storm.noticed[reason] = d
			}
		}
	}
	note("storm: %d/%d registered %v after the restart, peak RSS %s MiB, peak %.0f registrations/s", r.reached, r.want,
		r.took.Round(100*time.Millisecond), mib(r.peakRSS), r.peakRate)
	return nil
}
