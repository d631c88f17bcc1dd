// Command tunnelbench is `make bench-tunnel`: the benchmark of issue 9. It
// builds the e2e world once (a real kube-apiserver, tether-gateway on a
// cloud host with nftables DNAT, one edge site behind NAT with tether-edge
// and a stand-in kubelet) and measures, in one run and on one machine:
//
//   - tunnel: the cloud client host to the edge's stand-in kubelet by the
//     node's address, routed via the gateway, through the QUIC tunnel;
//   - pod: the same stand-in server at a pod address of the edge node
//     (issue 31, pod.go): a network namespace linked to the edge host as
//     a CNI does, holding an address of the Node's spec.podCIDRs, and a
//     Pod object bound to the node declaring the port; the client routes
//     the pod range to the gateway (--edge-pod-cidrs), and the edge dials
//     the pod after its allow list of the node's pods;
//   - service: the other way (issue 31, service.go): a client in that
//     pod's namespace on the edge host to a cloud Service marked
//     tether.io/edge-access, by its ClusterIP: the edge's rules (table
//     inet tether-edge) redirect it to tether-edge's service listener,
//     which opens a service stream to the gateway, which dials the
//     Service's endpoint, the direct mode's stand-in on a cloud host
//     (a cloud Node, its EndpointSlice and the Service written by the
//     admin; no kube-proxy: the ClusterIP is only the rules' match);
//   - pod-direct: the same client in the pod's namespace to the same
//     stand-in by its address, the edge host forwarding and the site
//     router masquerading as for the site's own hosts, without Tether;
//   - direct: the same client to the same kind of stand-in (same TLS, same
//     handler) on another cloud host, without Tether;
//   - bare quic-go: one stream over loopback UDP in this process with
//     tunnel.QUICConfig, ServerTLS and ClientTLS, no relay (bulk only);
//   - quic-path: the same between the edge host and the gateway host, over
//     the tunnel's own path through the NAT and routers (bulk only);
//   - konnectivity: Konnectivity (apiserver-network-proxy, built from its
//     module by tools/build-konnectivity.sh) in the same world: proxy-server
//     on the gateway host, proxy-agent on the edge host dialling it (gRPC
//     over mTLS), the client reaching the same stand-in kubelet through the
//     server's HTTP-CONNECT frontend as kube-apiserver's egress selector
//     does (konnectivity.go).
//
// Then (issue 19, scenarios.go) the same world's site uplink is shaped as
// WAN links are (testenv's WAN emulator: delay, loss, rate) and each
// scenario measures, Tether against Konnectivity: head-of-line isolation
// (new-connection GETs while one connection downloads), bulk throughput
// and CPU per byte, and new connections, all time-bounded (--wan-time);
// then a link cut (heal time; a request in flight across a short cut) and
// a NAT rebinding during a download. The last line printed sums it up in
// a machine-readable form (wan: ...; its pod_* fields, last, put the pod
// mode beside the tunnel's, tunnel/pod, from the clean measurement; its
// svc_* fields then the service mode beside pod-direct, pod-direct/service).
// The text output and SVG plots of
// the head-of-line p99 and the bulk throughput in each link scenario,
// Tether beside Konnectivity, are written into --out.
//
// Metrics: new-connection request rate (one HTTPS GET /healthz per new TCP
// connection) sequentially and with concurrent clients, with p50/p99
// latency; bulk throughput of one connection (GET /bytes); and the CPU
// time all this cost, per request and per byte, in tether-gateway plus
// tether-edge and in this process. It prints tables and how the tunnel
// fares against the targets. It asserts nothing: rates on a shared
// machine vary with its load, which it prints with them; CPU per request
// varies much less, and --baseline measures other binaries in the same
// world, interleaved, for before/after comparisons.
//
// Within a run the modes' new-connection measurements take turns every few
// dozen requests, so that all see the same load even on a busy machine.
//
// It needs root (network namespaces) and uses only addresses inside the
// namespaces it creates and loopback. --profile DIR writes CPU profiles of
// tether-gateway, tether-edge and this process for each phase of the first
// run (the binaries are then built with a profiling hook added by `go
// build -overlay`, see profile.go; the source tree is not changed).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/e2e/benchplot"
	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/testenv"
)

type options struct {
	binDir     string
	baseline   string
	runs       int
	seq        int
	conc       int
	concReqs   int
	bulk       int64
	timeout    time.Duration
	profileDir string
	verbose    bool

	scenarioList string
	scenarios    []scenario
	wanTime      time.Duration
	holClients   int
	konnectivity bool
	pod          bool
	service      bool
	tcpCC        string
	outDir       string
}

func main() {
	var o options
	flag.StringVar(&o.binDir, "bin-dir", "", "`dir` holding tether-gateway and tether-edge, as make build leaves them in bin; empty builds them from this tree into a temporary directory")
	flag.StringVar(&o.baseline, "baseline", "", "also measure the tunnel with the tether-gateway and tether-edge in `dir` (such as a build before a change), interleaved with the binaries under test in the same world: before/after numbers under the same load")
	flag.IntVar(&o.runs, "runs", 3, "measure every mode this many `times` (the tables show the median of each column); within a run the new-connection measurements of the modes take turns, the bulk transfers follow one another")
	flag.IntVar(&o.seq, "seq", 500, "`requests` of the sequential new-connection measurement")
	flag.IntVar(&o.conc, "conc", 32, "concurrent `clients` of the concurrent new-connection measurement")
	flag.IntVar(&o.concReqs, "conc-requests", 3000, "`requests` of the concurrent new-connection measurement, shared by the clients")
	flag.Int64Var(&o.bulk, "bulk", 512<<20, "`bytes` of the one-connection bulk transfer")
	flag.DurationVar(&o.timeout, "timeout", 20*time.Minute, "give up after this `duration` (world setup included); the defaults take about 10 minutes on a quiet 2-core machine")
	flag.StringVar(&o.profileDir, "profile", "", "write CPU profiles of the gateway, the edge and this process into `dir`, for each phase of the first run: seq and c32 (all modes taking turns) and each mode's bulk (builds profiling binaries; ignores --bin-dir)")
	flag.BoolVar(&o.verbose, "v", false, "log the world's setup steps")
	flag.StringVar(&o.scenarioList, "scenarios", scenarioNames(), "comma-separated `list` of link scenarios to run, in this order whatever the list's: clean (the full measurement above plus head-of-line), rtt30, rtt80-loss1, rtt80-loss3, rate20-rtt80 (the site's uplink shaped in both directions), cut (30 s link cut, heal time; 3 s cut with a request in flight) and nat (NAT rebinding during a download)")
	flag.DurationVar(&o.wanTime, "wan-time", 5*time.Second, "`duration` of each time-bounded measurement of a shaped scenario, per mode: head-of-line, bulk, and new connections (half sequential, half concurrent); also of the clean head-of-line one")
	flag.IntVar(&o.holClients, "hol-clients", 8, "`clients` making new-connection requests during the head-of-line measurement")
	flag.StringVar(&o.outDir, "out", "", benchplot.Help("tunnelbench"))
	flag.BoolVar(&o.pod, "pod", true, "also measure the pod mode: the same stand-in server at a pod address of the edge node, reached through --edge-pod-cidrs and the edge's allow list of its node's pods (the edge then runs its apiserver proxy, through which it reads them), taking turns with the other modes")
	flag.BoolVar(&o.service, "service", true, "also measure the service mode: a client in a pod network namespace on the edge host (as --pod builds it) to a cloud Service marked tether.io/edge-access, by its ClusterIP, through the edge's rules, tether-edge's service listener and the gateway (both run with --edge-services), against pod-direct, the same client to the same stand-in by its address routed out of the site without Tether, taking turns with the other modes")
	flag.BoolVar(&o.konnectivity, "konnectivity", true, "also measure Konnectivity (apiserver-network-proxy, built from its module by tools/build-konnectivity.sh) in the same world")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: tunnelbench [flags]\n\nBenchmarks the Tether tunnel against a direct connection, bare quic-go and Konnectivity, on a clean\nand on shaped WAN links (delay, loss, rate), through a link cut and a NAT rebinding, in network\nnamespaces on this machine (needs root). The last line printed is machine-readable (wan: ...).\n\n")
		flag.PrintDefaults()
	}
	flag.StringVar(&o.tcpCC, "tcp-cc", "", "TCP congestion `control` (net.ipv4.tcp_congestion_control) of the gateway and edge hosts, whose TCP crosses the WAN in Konnectivity's mode: one of the machine's net.ipv4.tcp_allowed_congestion_control, such as reno (loss-based, as quic-go's controller, NewReno in v0.65, which the tunnel always uses) or bbr; empty keeps what the namespaces inherit from the machine")
	flag.Parse()
	if o.runs < 1 || o.seq < 1 || o.conc < 1 || o.concReqs < o.conc || o.bulk < 1 || o.wanTime < time.Second || o.holClients < 1 {
		fmt.Fprintln(os.Stderr, "tunnelbench: --runs, --seq, --conc, --bulk and --hol-clients must be positive, --conc-requests at least --conc, --wan-time at least 1s")
		os.Exit(2)
	}
	var err error
	if o.scenarios, err = parseScenarios(o.scenarioList); err != nil {
		fmt.Fprintf(os.Stderr, "tunnelbench: --scenarios: %v\n", err)
		os.Exit(2)
	}
	world.RunBenchOut("tunnelbench", o.verbose, o.timeout, o.outDir, func(ctx context.Context, s *testenv.Session, out *benchplot.Out) error {
		return run(ctx, s, o, out)
	})
}

func run(ctx context.Context, s *testenv.Session, o options, out *benchplot.Out) error {
	printHeader(o, out.Dir)
	setup := time.Now()

	var prof *profiler
	var bins world.Binaries
	var err error
	if o.profileDir != "" {
		prof, err = newProfiler(o.profileDir)
		if err != nil {
			return err
		}
		note("building profiling tether-gateway and tether-edge into %s", o.profileDir)
		bins, err = prof.build()
	} else {
		bins, err = world.BenchBinaries(s, o.binDir, note, "tether-gateway", "tether-edge")
	}
	if err != nil {
		return err
	}
	var konnDir, konnVersion string
	if o.konnectivity {
		note("building (or finding in the cache) Konnectivity's proxy-server and proxy-agent")
		if konnDir, konnVersion, err = buildKonnectivity(ctx); err != nil {
			return err
		}
	}
	var base world.Binaries
	if o.baseline != "" {
		if base, err = world.BenchBinaries(s, o.baseline, note, "tether-gateway", "tether-edge"); err != nil {
			return fmt.Errorf("--baseline: %w", err)
		}
	}

	// world.RunBench's logger drops Info lines unless verbose.
	logf := s.Logf
	// One gateway and one edge node; with a baseline, a second pair runs
	// the baseline binaries at the same time (each edge dials both
	// gateways, and the client routes each node's address to its own
	// gateway), so the two take turns without restarts.
	hosts, gateways := []string{"edge-1"}, 1
	if o.baseline != "" {
		hosts, gateways = append(hosts, "edge-2"), 2
	}
	note("building the world: control plane, %d gateway(s), one edge site with %d node(s)", gateways, len(hosts))
	testenv.Binaries(s)
	w := world.New(s, bins, world.Options{Gateways: gateways, Sites: []testenv.SiteSpec{
		{Name: "site-a", Hosts: hosts, LAN: netip.MustParsePrefix("192.168.1.0/24")},
	}, PodCIDRs: o.pod || o.service}, logf)
	if o.pod || o.service {
		w.ApplyEdgeRBAC(s)
	}
	// start starts a gateway and an edge; with pod, the gateway routes
	// the edge pod ranges, the edge reads its node's pods through its
	// apiserver proxy (no node pool: nothing else runs beside), and the
	// client routes the edge's pod range to that gateway. With svc, both
	// run with --edge-services (the edge reads the Services and its pod
	// ranges through its apiserver proxy).
	start := func(i int, bins world.Binaries, pod, svc bool) (gw *testenv.Host, edge *world.Edge, pids []int) {
		gw, edge = w.Gateways[i], w.Edges[i]
		w.Bins = bins
		// Debug logging writes a line per connection on both sides; a
		// deployment runs at info.
		gwArgs, edgeArgs := []string{"--netrules", "nftables", "--log-level", "info"}, []string{"--log-level", "info"}
		if pod {
			gwArgs = append(gwArgs, "--edge-pod-cidrs", world.EdgePodCIDRs.String())
		}
		if svc {
			gwArgs = append(gwArgs, "--edge-services", "--service-streams-per-second", strconv.Itoa(svcRate))
			edgeArgs = append(edgeArgs, "--edge-services")
		}
		if pod || svc {
			edgeArgs = append(append(w.ProxyArgs(edge), "--pool-listen="), edgeArgs...)
		}
		g := w.StartGateway(s, gw, gwArgs...)
		e := w.StartEdge(s, edge, edgeArgs...)
		w.RouteVia(s, netip.PrefixFrom(edge.Host.Addr, 32), gw)
		if pod {
			w.RouteVia(s, edge.PodCIDR, gw)
		}
		if prof != nil && bins == prof.bins { // only the profiling build has the hook
			prof.procs = []profiled{{"gateway", g.Process}, {"edge", e.Process}}
		}
		return gw, edge, []int{g.Process.Pid, e.Process.Pid}
	}
	gw, edge, pids := start(0, bins, o.pod, o.service)
	modes := []mode{{name: "tunnel", desc: fmt.Sprintf("client → %s → QUIC → %s → kubelet %s", gw.Label, edge.Name, edge.Kubelet.Addr),
		url: edge.KubeletURL(""), pids: pids, profiled: prof != nil}}
	var podHost *testenv.Host
	var podURL string
	if o.pod || o.service {
		note("starting the stand-in pod on %s (pod range %s)", edge.Name, edge.PodCIDR)
		url, h, err := startPod(ctx, s, w, edge)
		if err != nil {
			return err
		}
		podHost, podURL = h, url
	}
	if o.pod {
		url := podURL
		modes = append(modes, mode{name: podMode, desc: fmt.Sprintf("client → %s (--edge-pod-cidrs %s) → QUIC → %s → pod %s (in %s's range %s)",
			gw.Label, world.EdgePodCIDRs, edge.Name, strings.TrimPrefix(url, "https://"), edge.Name, edge.PodCIDR),
			url: url, pids: pids, profiled: prof != nil})
	}
	if o.baseline != "" {
		bgw, bedge, bpids := start(1, base, false, false)
		modes = append(modes, mode{name: "baseline", desc: fmt.Sprintf("the same through %s and %s, running the binaries in %s", bgw.Label, bedge.Name, o.baseline),
			url: bedge.KubeletURL(""), pids: bpids})
	}
	if err := w.WaitReachable(ctx, 30*time.Second); err != nil {
		return err
	}
	cc, err := setTCPCongestionControl(o.tcpCC, w.Gateways, w.Edges)
	if err != nil {
		return err
	}
	note("TCP congestion control on the gateway and edge hosts: %s (quic-go: its own NewReno)", cc)
	// The direct reference: the same stand-in server on another cloud host.
	refHost := w.Topo.Cloud("apiserver")
	ref := world.StartKubelet(s, refHost, "direct-ref", w.KubeletCA)
	bq, err := newLoopbackQUIC(s)
	if err != nil {
		return err
	}
	// The same, but across the tunnel's own path (the site's NAT router
	// and the cloud router), to tell the cost of the emulated network from
	// the cost of the relay.
	pq, err := newBareQUIC(s, gw, gw.Addr.String(), edge.Host)
	if err != nil {
		return err
	}
	var konn *konnectivity
	if konnDir != "" {
		note("starting Konnectivity %s: proxy-server on %s, proxy-agent on %s", konnVersion, gw.Label, edge.Name)
		k, err := startKonnectivity(ctx, s, konnDir, konnVersion, w.Dir, gw, edge.Host, w.Client, edge.Kubelet.Addr)
		if err != nil {
			return err
		}
		konn = k
		modes = append(modes, mode{name: konnMode,
			desc: fmt.Sprintf("client → %s proxy-server (HTTP CONNECT over mTLS) → gRPC/TCP/mTLS → proxy-agent on %s → kubelet (Konnectivity %s)", gw.Label, edge.Name, konnVersion),
			url:  edge.KubeletURL(""), pids: k.pids(), client: newClient(k.DialContext, w.KubeletCA.Pool())})
	}
	modes = append(modes,
		mode{name: "direct", desc: "client → stand-in on the apiserver host " + ref.Addr, url: "https://" + ref.Addr},
	)
	if o.service {
		addr, err := startService(ctx, w, refHost)
		if err != nil {
			return err
		}
		if err := openPodDirect(s, edge); err != nil {
			return err
		}
		note("marked Service %s at %s, its endpoint the stand-in %s on Node %s", svcName, addr, ref.Addr, cloudNodeName)
		roots := w.KubeletCA.Pool()
		modes = append(modes,
			mode{name: svcMode, desc: fmt.Sprintf("pod %s on %s → ClusterIP %s (tether.io/edge-access) → tether-edge :%d → QUIC → %s (--service-streams-per-second %d) → stand-in %s",
				podHost.Addr, edge.Name, addr, edgeServicePort, gw.Label, svcRate, ref.Addr),
				url: "https://" + ref.Addr, pids: pids, profiled: prof != nil, client: newClient(dialTo(podHost, addr), roots)},
			mode{name: podDirectMode, desc: fmt.Sprintf("pod %s on %s → %s → site router (NAT) → stand-in %s", podHost.Addr, edge.Name, edge.Name, ref.Addr),
				url: "https://" + ref.Addr, client: newClient(podHost.DialContext, roots)},
		)
	}
	modes = append(modes,
		mode{name: "bare-quic", desc: "one quic-go stream over loopback UDP in this process, no relay", bulkOnly: true, bare: bq},
		mode{name: "quic-path", desc: fmt.Sprintf("the same from %s to %s, over the tunnel's path (NAT, routers)", edge.Name, gw.Label), bulkOnly: true, bare: pq},
	)
	note("world ready in %v", time.Since(setup).Round(time.Second))
	b := &bench{o: o, client: newClient(w.Client.DialContext, w.KubeletCA.Pool()), prof: prof}
	wb := &wanBench{bench: b, w: w, gw: gw, edge: edge, tun: modes[0], d: o.wanTime, k: konn}
	for _, m := range modes {
		// pod: the gateway routes the range once it has read the Node,
		// the edge dials the pod once its informers have synced.
		// service: the edge redirects the ClusterIP once it has read the
		// Service, the gateway dials the endpoint once it has read the
		// EndpointSlice and the Node.
		if m.name == podMode || m.name == svcMode {
			if _, err := wb.working(ctx, m, time.Minute); err != nil {
				return err
			}
		}
	}
	for _, m := range modes {
		switch m.name {
		case konnMode:
			wb.konn = m
		case "quic-path":
			wb.path = m
		}
		if !m.bulkOnly {
			wb.rate = append(wb.rate, m)
		}
		if m.pids != nil {
			wb.bulk = append(wb.bulk, m)
		}
	}
	sum := summary{tcpCC: cc, scen: map[string]*scenResult{}}
	shaped := false
	for i, sc := range o.scenarios {
		if sc.event && shaped {
			if err := shape(edge.Site, link{}); err != nil {
				return fmt.Errorf("clear the link shape: %w", err)
			}
			shaped = false
		}
		switch sc.name {
		case "cut":
			cr, err := wb.runCut(ctx)
			if err != nil {
				return err
			}
			sum.cut = cr
			printCut(cr)
			continue
		case "nat":
			nr, err := wb.runNAT(ctx)
			if err != nil {
				return err
			}
			sum.nat = nr
			printNAT(nr)
			continue
		}
		sr := &scenResult{sc: sc, fig: map[string]*figures{}}
		sum.scen[sc.name] = sr
		if sc.name == "clean" {
			phase("clean: the full measurement (%d runs of every mode)", o.runs)
			res, err := b.measure(ctx, modes)
			if err != nil {
				return err
			}
			fmt.Println()
			printTable(o, modes, res)
			printTargets(o, res)
			sum.clean = res
			fromMeasure(sr, o, modes, res)
		} else {
			phase("%s: shaping the site's uplink: %s", sc.name, sc.desc)
			if err := shape(edge.Site, sc.link); err != nil {
				sr.skipped = err.Error()
				printScenario(o, sr, modes)
				continue
			}
			shaped = true
			if err := wb.waitWorking(ctx, 30*time.Second); err != nil {
				return fmt.Errorf("%s: %w\n%s", sc.name, err, wb.diagnose(ctx))
			}
		}
		if err := wb.runShaped(ctx, sr, i); err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		if st, ok := wb.tunnelStatus(ctx); ok {
			sr.rttMs = st.RTTMillis
		}
		printScenario(o, sr, modes)
	}
	if shaped {
		if err := shape(edge.Site, link{}); err != nil {
			return fmt.Errorf("clear the link shape: %w", err)
		}
	}
	printNotes(ctx, w, gw, edge, o, prof)
	printSummary(o, sum)
	if err := out.Plots(charts(o, sum)); err != nil {
		note("%v", err)
	}
	fmt.Printf("load average at the end: %s\n", world.LoadAvg())
	fmt.Println(wanLine(o, sum))
	return nil
}

func note(format string, args ...any) {
	benchkit.Note(os.Stderr, "tunnelbench", false, format, args...)
}

// printNotes says what the tested gateway and edge logged about their
// UDP sockets, the tunnel's round-trip time, and where the profiles are.
func printNotes(ctx context.Context, w *world.World, gw *testenv.Host, edge *world.Edge, o options, prof *profiler) {
	fmt.Println()
	for _, p := range []struct {
		name string
		log  string
	}{{"gateway", w.Log(gw)}, {"edge", w.Log(edge.Host)}} {
		var warn []string
		for _, line := range strings.Split(p.log, "\n") {
			if strings.Contains(line, "buffer size") || strings.Contains(line, "GSO") {
				warn = append(warn, strings.TrimSpace(line))
			}
		}
		if len(warn) == 0 {
			fmt.Printf("%s log: no UDP buffer or GSO warnings from quic-go\n", p.name)
		}
		for _, l := range warn {
			fmt.Printf("%s log: %s\n", p.name, l)
		}
	}
	var st statusapi.Gateway
	if out, err := world.Get(ctx, gw, world.GatewayAdmin(gw, "/status")); err == nil && json.Unmarshal([]byte(out), &st) == nil {
		for _, e := range st.Edges {
			if e.Node == edge.Name {
				fmt.Printf("tunnel round trip (smoothed, %s /status): %.2f ms\n", gw.Label, e.RTTMillis)
			}
		}
	}
	if o.service {
		printServiceCounters(ctx, gw, edge)
	}
	if prof != nil {
		fmt.Printf("CPU profiles of the first run: %s (e.g. go tool pprof -top %s/tether-gateway-seq.pprof)\n", o.profileDir, o.profileDir)
	}
}
