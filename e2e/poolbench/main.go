// Command poolbench is `make bench-pool`: the node pool benchmark. It
// builds the e2e world once (a real kube-apiserver and etcd in a cloud
// network, one edge site "shop" behind NAT with --edges nodes labelled
// apps.openyurt.io/nodepool=shop) and creates --changes EndpointSlices in
// namespace bench, and starts one tether-gateway in the cloud network: the
// edges connect to it in both phases, as they campaign for the pool's lead
// through it (nodes may only read the election record), so its tunnels'
// keepalives are in both phases' uplink figures. Then, in each run, it
// measures these phases (--phases) with fresh tether-edge processes (the
// apiserver proxy and the tunnel, default settings, a fresh data
// directory each):
//
//   - no-pool: --pool-listen "", every node's proxy relays its kube-proxy's
//     watch to the cloud;
//   - pool: the default, one elected node watches EndpointSlices,
//     Endpoints and Services in the cloud and the others replicate its
//     store over the pool listener and serve their kube-proxy from it;
//   - members: the pool at size, --members nodes: one tether-edge (on
//     the first edge, so the only candidate and the leader) and
//     --members − 1 simulated followers in this process, each the
//     project's own poolstore.Follower with a bbolt replica of its own, a
//     node certificate and Node of its own (sim-001, ...) and its own
//     TLS connection to the leader's pool listener, which leaves from
//     the second edge's namespace and so crosses the site's LAN (a
//     forwarder in this process carries it there and counts its bytes).
//     The slices change once with the leader alone (its CPU then is the
//     base of the followers' cost); then it measures the followers' first
//     sync, the leader's CPU, RSS and goroutines per follower, the bytes
//     on each follower's connection at idle and while the slices change
//     once more, and the replication lag: a follower's replica holding a
//     change minus the leader node's kube-proxy-like informer receiving
//     it. The followers' CPU is this process's: on this machine they
//     compete with the leader for its cores, as real followers on their
//     own nodes do not.
//
// On every node a kube-proxy-like client-go informer (in this process,
// dialling from the node's namespace, kube-proxy's User-Agent and content
// types) watches EndpointSlices of all namespaces through the node's
// proxy. Once they are synced, the bench reads the site router's uplink
// counters (wan0: rx is cloud → site), waits --idle with no change, then
// changes every EndpointSlice once (one endpoint address each) and waits
// until every informer has seen every change. It reports the uplink
// bytes of the change window and of the idle window, the ratio with/without
// the pool, the replication lag (a follower's informer receiving a change
// minus the leader's informer receiving it), the time from the cloud
// update returning to the informers, and the RSS of every tether-edge.
//
// It prints tables and how the pool fares against the targets; it
// asserts nothing. Its last line is machine-readable:
//
//	pool: members=<n> lag_p99_ms=<> leader_cpu_pct=<> leader_rss_mib=<> lan_bytes_per_follower=<>
//
// from the members phase (or, without it, the pool phase). Timings on a shared machine vary with its load, which
// it prints at start and end. The text output and an SVG plot of the
// replication lag's distribution are written into --out.
//
// It needs root (network namespaces) and uses only addresses inside the
// namespaces it creates and loopback; everything is removed at the end,
// also on Ctrl-C.
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/e2e/benchplot"
	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

type options struct {
	binDir  string
	runs    int
	changes int
	edges   int
	workers int
	idle    time.Duration
	settle  time.Duration
	timeout time.Duration
	verbose bool

	phases     []string // of allPhases, in that order
	members    int
	cpuProfile string
	outDir     string
}

// The phases, in the order a run measures them (no-pool and pool swap
// places in even runs).
const (
	phaseNoPool  = "no-pool"
	phasePool    = "pool"
	phaseMembers = "members"
)

var allPhases = []string{phaseNoPool, phasePool, phaseMembers}

func (o options) has(phase string) bool { return slices.Contains(o.phases, phase) }

func main() {
	var o options
	flag.StringVar(&o.binDir, "bin-dir", "", "`dir` holding tether-edge and tether-gateway, as make build leaves them in bin; empty builds it from this tree into a temporary directory")
	flag.IntVar(&o.runs, "runs", 1, "measure the phases this many `times` (no-pool and pool alternate which goes first); the targets are judged on the median ratio, the lag of all runs together and the largest RSS")
	flag.IntVar(&o.changes, "changes", 1000, "`n` EndpointSlices (5 endpoints each) in namespace bench; each phase changes every one once")
	flag.IntVar(&o.edges, "edges", 10, "`n` edge nodes in the pool")
	flag.IntVar(&o.workers, "workers", 4, "concurrent `writers` of the changes (the admin client allows 100 requests/s)")
	flag.DurationVar(&o.idle, "idle", 10*time.Second, "measure the uplink with no changes for this `duration` in each phase (health checks, election renewals)")
	flag.DurationVar(&o.settle, "settle", 5*time.Second, "wait this `duration` after the informers synced before measuring")
	flag.DurationVar(&o.timeout, "timeout", 20*time.Minute, "give up after this `duration` (world setup included)")
	flag.BoolVar(&o.verbose, "verbose", false, "log the world's setup and each phase's steps")
	phases := flag.String("phases", strings.Join(allPhases, ","), "the `phases` to measure in each run, comma-separated: no-pool (every node watches the cloud), pool (--edges tether-edge in one pool), members (one tether-edge leading --members − 1 simulated followers)")
	flag.IntVar(&o.members, "members", 100, "`n` nodes in the pool of the members phase: one tether-edge, the leader, and n − 1 simulated followers (2..1000)")
	flag.StringVar(&o.cpuProfile, "cpu-profile", "", "write a CPU profile of the leader during the members phase's changes to this `file` (the leader runs with --profiling), and one of this process, whose simulated followers share the machine with it, to file.followers")
	flag.StringVar(&o.outDir, "out", "", benchplot.Help("poolbench"))
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: poolbench [flags]\n\nBenchmarks the Tether node pool: uplink bytes with and without it, replication lag, RSS per node, and a pool at size (--members: the leader's CPU and RSS, lag and LAN bytes per follower), in network namespaces on this machine (needs root).\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	var asked []string
	for _, p := range strings.Split(*phases, ",") {
		if p = strings.TrimSpace(p); !slices.Contains(allPhases, p) {
			fmt.Fprintf(os.Stderr, "poolbench: --phases: unknown phase %q (phases: %s)\n", p, strings.Join(allPhases, ", "))
			os.Exit(2)
		}
		asked = append(asked, p)
	}
	for _, p := range allPhases {
		if slices.Contains(asked, p) {
			o.phases = append(o.phases, p)
		}
	}
	if o.members < 2 || o.members > 1000 {
		fmt.Fprintf(os.Stderr, "poolbench: --members must be 2..1000\n")
		os.Exit(2)
	}
	if o.runs < 1 || o.runs > maxRounds/(len(allPhases)+1) || o.changes < 1 || o.changes > maxSlices || o.edges < 2 || o.edges > 200 || o.workers < 1 || o.idle <= 0 || o.settle < 0 {
		fmt.Fprintf(os.Stderr, "poolbench: --runs must be 1..%d, --changes 1..%d, --edges 2..200, --workers and --idle positive\n", maxRounds/(len(allPhases)+1), maxSlices)
		os.Exit(2)
	}
	world.RunBenchOut("poolbench", o.verbose, o.timeout, o.outDir, func(ctx context.Context, s *testenv.Session, out *benchplot.Out) error {
		return run(ctx, s, o, out)
	})
}

func run(ctx context.Context, s *testenv.Session, o options, out *benchplot.Out) error {
	printHeader(o, out.Dir)
	setup := time.Now()
	bins, err := world.BenchBinaries(s, o.binDir, note, "tether-edge", "tether-gateway")
	if err != nil {
		return err
	}
	// world.RunBench's logger drops Info lines unless verbose.
	logf := s.Logf
	hosts := make([]string, o.edges)
	for i := range hosts {
		hosts[i] = fmt.Sprintf("edge-%d", i+1)
	}
	note("building the world: control plane, site %s with %d nodes in pool %s", siteName, o.edges, siteName)
	testenv.Binaries(s)
	w := world.New(s, bins, world.Options{Sites: []testenv.SiteSpec{
		{Name: siteName, Hosts: hosts, LAN: netip.MustParsePrefix("192.168.9.0/24")},
	}}, logf)
	w.ApplyEdgeRBAC(s)
	w.StartGateway(s, w.Gateways[0])
	note("creating %d EndpointSlices in namespace %s", o.changes, benchNS)
	if err := createSlices(ctx, w.CP.Client, o.changes); err != nil {
		return err
	}
	site := w.Topo.Sites[0]
	counters, err := newEdgeCounters(ctx, site.Router(), w.Edges)
	if err != nil {
		return err
	}
	note("world ready in %v", time.Since(setup).Round(time.Second))

	b := &bench{o: o, s: s, w: w, bins: bins, uplink: uplink{site.Router()}, perEdge: counters, logf: logf}
	var res []phaseResult
	var mres []membersResult
	round := 0
	for r := 1; r <= o.runs; r++ {
		var order []bool // pool off, then on
		for _, p := range []string{phaseNoPool, phasePool} {
			if o.has(p) {
				order = append(order, p == phasePool)
			}
		}
		if r%2 == 0 {
			slices.Reverse(order)
		}
		for _, pool := range order {
			round++
			start := time.Now()
			pr, err := b.phase(ctx, r, round, pool)
			if err != nil {
				return fmt.Errorf("run %d, %s: %w", r, phaseName(pool), err)
			}
			note("run %d %s done in %v", r, pr.phase, time.Since(start).Round(time.Second))
			res = append(res, pr)
		}
		if o.has(phaseMembers) {
			round += 2
			start := time.Now()
			mr, err := b.membersPhase(ctx, r, round-1, round)
			if err != nil {
				return fmt.Errorf("run %d, %s: %w", r, phaseMembers, err)
			}
			note("run %d %s done in %v", r, phaseMembers, time.Since(start).Round(time.Second))
			mres = append(mres, mr)
		}
	}
	if len(res) > 0 {
		printTable(o, res)
		printTargets(res)
		printNotes(res)
	}
	if len(mres) > 0 {
		printMembers(o, mres)
	}
	if err := out.Plots(charts(res, mres)); err != nil {
		note("%v", err)
	}
	fmt.Printf("\nload average at end: %s\n", world.LoadAvg())
	printSummary(res, mres)
	return nil
}

const (
	siteName = "shop"
	benchNS  = "bench"
)

func note(format string, args ...any) {
	benchkit.Note(os.Stderr, "poolbench", false, format, args...)
}
