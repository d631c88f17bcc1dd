// Command scalebench is `make bench-scale`: the fleet-scale benchmark of
// issue 18. One tether-gateway (the real binary) on a cloud host serves
// --edges simulated edge nodes, in network namespaces on this machine, with
// a real kube-apiserver and etcd holding a Node for each (edge label, pool
// label apps.openyurt.io/nodepool in pools of 10, a unique InternalIP in
// the gateway's --edge-cidrs).
//
// The edges are played by a load generator: this program run again inside
// an edge site's namespace, behind the site's NAT router (agent.go). Each
// simulated edge is the edge tunnel of tether-edge (package edgetunnel):
// its own node client certificate (CN=system:node:edge-<i>, O=system:nodes,
// signed by the cluster CA the gateway trusts), its own QUIC connection
// and UDP socket, keepalives, the jittered reconnect backoff and the real
// stream protocol; it answers relayed connections with a stand-in kubelet
// (TLS, GET /healthz) in the load generator, so routing through the
// gateway can be measured end to end.
//
// Phases (--phases selects; cold always runs, as it connects the fleet):
//
//   - cold: from the gateway's start until every edge is registered on
//     its /status; the gateway's RSS and CPU meanwhile;
//   - steady: --steady of keepalives only: RSS per edge, CPU %, UDP
//     datagrams per second in the gateway's namespace;
//   - routing: new-connection HTTPS GETs (one TCP connection and TLS
//     handshake each) from the cloud client host to random edges' kubelet
//     addresses, through the gateway's DNAT and transparent listener;
//     before the cold start the same against a gateway with one edge
//     connected;
//   - scrape (only when named in --phases): a real Prometheus on the
//     cloud client host scrapes --scrape-pods pods spread over the fleet,
//     by pod IP through the gateway (--edge-pod-cidrs; every edge Node
//     then has a pod range of its own), every --scrape-interval for
//     --scrape-duration after every target is up: scrape durations from
//     Prometheus, the gateway's CPU per scrape, in all and above its CPU
//     without scrapes measured before and after (scrape.go);
//   - storm: kill -9 the gateway and start it again: time until every edge
//     is registered again, peak RSS, registrations per second, datagrams
//     dropped for a full receive buffer in the gateway's namespace (as in
//     the cold start), and how the edges' old connections ended (a
//     stateless reset drawn by their liveness probe, or an idle timeout);
//   - heartbeats: --hb-offline edges go offline in pools of 10 (a leader
//     and 9 members), and the leaders renew the members' Leases through
//     the gateway every --hb-interval for --hb-duration: renewals written
//     per second, p99 from the leader's send (the Lease's renewTime) to
//     the Lease update seen by a watch, renewals lost;
//   - churn: --churn-rate Nodes added and removed per second for
//     --churn-duration: how soon a new node's name answers on the
//     gateway's DNS and its address is DNATed, gateway CPU;
//   - replicas: --replica-edges of the edges (default 3,000: each holds a
//     connection to every replica, and 3 × 10,000 QUIC connections with
//     their load generator stall on 2 cores) dial 3 gateway replicas; one
//     is killed -9 and restarted while routing runs through another:
//     routing errors meanwhile, time until the restarted one has every
//     edge again.
//
// It asserts nothing; the last line it prints is machine-readable, after
// the scrape phase's line when it ran:
//
//	scrape: pods=<n> up=<targets up at the end> scrapes=<in the window> failed=<n> scrape_p50_ms=<ms> scrape_p99_ms=<ms> gateway_cpu_pct=<in the window> gateway_cpu_ms_per_scrape=<ms> gateway_net_cpu_ms_per_scrape=<ms above the baseline> baseline_cpu_pct=<gateway without scrapes: before and after, mean> edges=<the fleet>
//	scale: edges=<connected at end> rss_mib=<gateway steady RSS> idle_cpu_pct=<gateway> cold_s=<cold start> restart_s=<storm> route_p99_ms=<N connected> route_p99_1_ms=<one edge> hb_per_s=<delegated renewals written/s> hb_lost=<n> cold_edges=<n> storm_edges=<n> hb_edges=<n> replica_edges=<n> replica_s=<restarted replica has every edge> replica_route_failed=<n>
//
// (a figure of a phase not run is -1; edges= is counted at the end of the
// phases on the whole fleet, before the replicas phase, whose fleet is
// replica_edges; the *_edges fields are each phase's fleet). The text
// output and an SVG plot of the edges registered against time (cold
// start, storm, the replica's restart) are written into --out. It needs
// root (network namespaces, nftables) and uses only addresses inside the
// namespaces it creates; it raises its open-file limit (and so the
// gateway's and the load generator's) as the edge count needs.
package main

import (
	"context"
	"flag"
	"fmt"
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
	binDir         string
	edges          int
	phases         phaseSet
	steady         time.Duration
	settle         time.Duration
	settleMax      time.Duration
	route          time.Duration
	routeConc      int
	registerWait   time.Duration
	hbOffline      int
	hbInterval     time.Duration
	hbDuration     time.Duration
	churnRate      int
	churnDuration  time.Duration
	churnProbe     int
	replicaEdges   int
	outDir         string
	profileDir     string
	logDir         string
	gatewayArgs    stringList
	timeout        time.Duration
	agentLogLevel  string
	verbose        bool
	createParallel int
	loadgenCPUs    string
	gatewayCPUs    string
	scrapePods     int
	scrapeInterval time.Duration
	scrapeDuration time.Duration
	scrapeBaseline time.Duration
}

// allPhases are the phases, in the order they run; defaultPhases those
// run unless --phases names others. The scrape phase needs Prometheus
// (make testbins) and several minutes: it runs only when named.
var (
	allPhases     = []string{"cold", "steady", "routing", "scrape", "storm", "heartbeats", "churn", "replicas"}
	defaultPhases = slices.DeleteFunc(slices.Clone(allPhases), func(p string) bool { return p == "scrape" })
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == agentArg {
		if err := runAgent(os.Args[2]); err != nil {
			fmt.Fprintf(os.Stderr, "scalebench agent: %v\n", err)
			os.Exit(1)
		}
		return
	}
	o := options{phases: phaseSet(defaultPhases)}
	flag.StringVar(&o.binDir, "bin-dir", "", "`dir` holding tether-gateway, as make build leaves it in bin; empty builds it from this tree into a temporary directory")
	flag.IntVar(&o.edges, "edges", 10000, "`n` simulated edge nodes (Nodes edge-1..edge-n, in pools of 10)")
	flag.Var(&o.phases, "phases", "comma-separated `phases` to run, in this order: "+strings.Join(allPhases, ",")+" (cold always runs: it connects the fleet; scrape runs only when named)")
	flag.DurationVar(&o.steady, "steady", time.Minute, "steady phase: measure this `duration` of keepalives only")
	flag.DurationVar(&o.settle, "settle", 30*time.Second, "steady phase: wait at least this `duration` after every edge registered before measuring; a new QUIC connection's path MTU discovery sends a probe each way with each of its first four keepalives, about 20 s")
	flag.DurationVar(&o.settleMax, "settle-max", 3*time.Minute, "steady phase: then wait, up to this `duration` in all, until the edges' liveness probes fall under one a second per 2,000 edges. Edges that connected while the gateway was loaded carry RTT estimates of seconds from their handshakes; quic-go stretches their keepalives to 1.5 PTO, and they probe, until the estimates decay: three minutes after a cold start of 10,000, 14 probes/s were left")
	flag.DurationVar(&o.route, "route", 15*time.Second, "routing phase: send new-connection GETs for this `duration`, with every edge connected and with one")
	flag.IntVar(&o.routeConc, "route-conc", 8, "routing: concurrent `clients`")
	flag.DurationVar(&o.registerWait, "register-timeout", 3*time.Minute, "give up waiting for every edge to register (cold start, storm) after this `duration`, and go on with those registered")
	flag.IntVar(&o.hbOffline, "hb-offline", 1000, "heartbeats: `n` edges offline (9 members of each pool of 10; the first edge of each pool is its leader)")
	flag.DurationVar(&o.hbInterval, "hb-interval", 10*time.Second, "heartbeats: each leader renews each offline member's Lease this `often`")
	flag.DurationVar(&o.hbDuration, "hb-duration", 2*time.Minute, "heartbeats: renew for this `duration`")
	flag.IntVar(&o.churnRate, "churn-rate", 100, "churn: `n` Nodes added and n removed per second")
	flag.DurationVar(&o.churnDuration, "churn-duration", time.Minute, "churn: for this `duration`")
	flag.IntVar(&o.churnProbe, "churn-probe", 5, "churn: probe the DNS answer and DNAT of every `n`th added node")
	flag.IntVar(&o.replicaEdges, "replica-edges", 3000, "replicas: `n` edges (at most --edges; 0: all) dial the 3 replicas, a QUIC connection to each. Measured on a 2-core machine: 3,000 registered on every replica; 10,000 (30,000 connections and their load generator) stalled at 2,755 after 3 minutes")
	flag.IntVar(&o.scrapePods, "scrape-pods", 1000, "scrape: `n` pods spread over the fleet (one every edges/n edges; several an edge when n > --edges), each scraped on its declared port")
	flag.DurationVar(&o.scrapeInterval, "scrape-interval", 15*time.Second, "scrape: Prometheus's scrape_interval")
	flag.DurationVar(&o.scrapeDuration, "scrape-duration", 3*time.Minute, "scrape: measure this `duration` once every target is up")
	flag.DurationVar(&o.scrapeBaseline, "scrape-baseline", 30*time.Second, "scrape: measure the gateway's CPU for this `duration` without scrapes, the fleet connected, before Prometheus starts and again after it stops")
	flag.StringVar(&o.outDir, "out", "", benchplot.Help("scalebench"))
	flag.StringVar(&o.profileDir, "profile", "", "write the gateway's CPU profile of each phase, and its heap and goroutines after the steady phase, into `dir` (from its --profiling endpoint, which the bench always turns on)")
	flag.StringVar(&o.logDir, "log-dir", "", "copy the logs of the gateway(s) and the load generator into `dir` at the end")
	flag.Var(&o.gatewayArgs, "gateway-arg", "extra tether-gateway `flag` (repeatable; e.g. --gateway-arg=--kube-api-qps=300)")
	flag.DurationVar(&o.timeout, "timeout", 20*time.Minute, "give up after this `duration` (setup included)")
	flag.StringVar(&o.agentLogLevel, "agent-log-level", "error", "log `level` of the simulated edges' tunnel code (in the load generator's log)")
	flag.IntVar(&o.createParallel, "create-parallel", 32, "concurrent `requests` creating Nodes")
	flag.BoolVar(&o.verbose, "v", false, "log the world's setup steps")
	flag.StringVar(&o.loadgenCPUs, "loadgen-cpus", "", "run the load generator on these `cpus` only (a taskset -c list, e.g. 1; empty: any). Measured on a 2-core machine: with the load generator on one CPU, 10,000 edges took 74 s to connect and the gateway's idle CPU did not fall")
	flag.StringVar(&o.gatewayCPUs, "gateway-cpus", "", "run each gateway on these `cpus` only (a taskset -c list; empty: any, as a deployment's gateway runs)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: scalebench [flags]\n\nBenchmarks one tether-gateway serving a fleet of simulated edges (issue 18), in network namespaces on this machine (needs root).\nThe default run (10,000 edges) is meant to fit in about 10 minutes; --edges 200 is a quick check.\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if o.edges < 1 || o.edges > maxEdges || o.steady <= 0 || o.settle < 0 || o.settleMax < o.settle || o.route <= 0 || o.routeConc < 1 || o.hbOffline < 0 ||
		o.hbInterval <= 0 || o.hbDuration <= 0 || o.churnRate < 1 || o.churnDuration <= 0 || o.churnProbe < 1 || o.replicaEdges < 0 {
		fmt.Fprintf(os.Stderr, "scalebench: --edges must be 1..%d; durations, --route-conc, --churn-rate and --churn-probe positive; --settle-max at least --settle\n", maxEdges)
		os.Exit(2)
	}
	if o.phases.has("scrape") && (o.edges > maxPodEdges || o.scrapePods < 1 || o.scrapePods > maxPodsPerEdge*o.edges ||
		o.scrapeInterval < time.Second || o.scrapeDuration <= 0 || o.scrapeBaseline <= 0) {
		fmt.Fprintf(os.Stderr, "scalebench: the scrape phase needs --edges at most %d (a /24 pod range each in %s), --scrape-pods 1..%d per edge, --scrape-interval at least 1s, durations positive\n",
			maxPodEdges, podRanges, maxPodsPerEdge)
		os.Exit(2)
	}
	if o.replicaEdges == 0 || o.replicaEdges > o.edges {
		o.replicaEdges = o.edges
	}
	raiseFileLimit(3*o.edges + 8192)
	world.RunBenchOut("scalebench", o.verbose, o.timeout, o.outDir, func(ctx context.Context, s *testenv.Session, out *benchplot.Out) error {
		return run(ctx, s, o, out)
	})
}

// phaseSet is the --phases flag.
type phaseSet []string

func (p *phaseSet) String() string { return strings.Join(*p, ",") }

func (p *phaseSet) Set(v string) error {
	var out []string
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(allPhases, f) {
			return fmt.Errorf("unknown phase %q (phases: %s)", f, strings.Join(allPhases, ","))
		}
		out = append(out, f)
	}
	*p = out
	return nil
}

func (p phaseSet) has(name string) bool { return name == "cold" || slices.Contains(p, name) }

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, " ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func note(format string, args ...any) {
	benchkit.Note(os.Stderr, "scalebench", true, format, args...)
}

func run(ctx context.Context, s *testenv.Session, o options, out *benchplot.Out) error {
	printHeader(o, out.Dir)
	b, err := setup(ctx, s, o)
	if err != nil {
		return err
	}
	res := &results{edges: o.edges, connectedAtEnd: -1}
	steps := []struct {
		phase string
		f     func(context.Context, *results) error
	}{
		{"routing", b.routeOne}, // marks its own health as routing-1: it stops its gateway
		{"cold", b.cold},
		{"steady", b.steadyState},
		{"routing", b.routeAll},
		{"scrape", b.scrape},
		{"storm", b.storm},
		{"heartbeats", b.heartbeats},
		{"churn", b.churn},
		{"replicas", b.replicas},
	}
	for _, st := range steps {
		if !o.phases.has(st.phase) {
			continue
		}
		if st.phase == "replicas" {
			// The whole fleet's last count: the replicas phase
			// restarts --replica-edges of it.
			res.connectedAtEnd = b.connectedAtEnd(ctx)
		}
		err := st.f(ctx, res)
		b.markHealth(ctx, st.phase, res) // nothing when no gateway runs
		if err != nil {
			res.failed = fmt.Errorf("%s: %w", st.phase, err)
			break
		}
	}
	if res.connectedAtEnd < 0 {
		res.connectedAtEnd = b.connectedAtEnd(ctx)
	}
	b.saveLogs()
	printResults(o, res)
	if err := out.Plots(charts(res)); err != nil {
		note("%v", err)
	}
	return res.failed
}

// pinned is name and args run on cpus only ("": anywhere).
func pinned(cpus, name string, args ...string) (string, []string) {
	if cpus == "" {
		return name, args
	}
	return "taskset", append([]string{"-c", cpus, name}, args...)
}
