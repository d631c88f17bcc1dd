package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/edgeproxy/edgetunnel"
	"github.com/tether-edge/tether/internal/testenv"
)

// The scrape phase (issue 31, "Scrape fan-out"): a real Prometheus on the
// cloud client host scrapes --scrape-pods pods spread over the fleet's
// edges every --scrape-interval, by pod IP, through the gateway. With the
// phase on, every edge Node has a pod range of its own in spec.podCIDRs
// (podRange, written by the admin when it makes the Node, as the control
// plane's node IPAM does), the gateway routes them (--edge-pod-cidrs
// podRanges) and the client host routes podRanges to it. The pods are Pod
// objects bound to their edge, their status (address, Running) written by
// the admin: no kubelet runs them. The load generator stands in for each
// edge's side: the real allow list of the edge tunnel, over an in-memory
// list of that node's pods (staticPods), and one /metrics server of its
// own (podMetrics) for every pod.

var (
	// podRangeBase + i·256 is the /24 of edge i, inside podRanges (clear
	// of the cloud LAN 10.0.0.0/24 and the Service range 10.96.0.0/16).
	podRangeBase = netip.MustParseAddr("10.128.0.0")
	podRanges    = netip.MustParsePrefix("10.128.0.0/9")
)

const (
	maxPodEdges = 1<<15 - 1 // edges whose /24 fits in podRanges
	// maxPodsPerEdge: a pod range's addresses from .2 to .254.
	maxPodsPerEdge = 253
	// scrapePort is the port every pod declares and serves /metrics on.
	scrapePort = 9100
	scrapeJob  = "edge-pods"
	scrapeApp  = "scalebench-scrape"
	// scrapeNamespace holds the pods.
	scrapeNamespace = "default"
	promUser        = "scalebench-prometheus"
)

// podRange is edge i's pod range.
func podRange(i int) netip.Prefix { return netip.PrefixFrom(addrAt(podRangeBase, i<<8), 24) }

// scrapePod is one pod of the scrape phase.
type scrapePod struct {
	k    int // 0 ..
	edge int // the edge it is bound to
	ip   netip.Addr
}

func (p scrapePod) name() string { return fmt.Sprintf("scrape-%d", p.k) }

// scrapeLayout places n pods on edges 1..edges: evenly spread, one an edge
// (every edges/n-th edge) while n ≤ edges, else round the fleet again and
// again. A pod's address is the next free one of its edge's range from
// .2 on.
func scrapeLayout(edges, n int) []scrapePod {
	out := make([]scrapePod, n)
	for k := range n {
		e, slot := 1+k*edges/n, 0
		if n > edges {
			e, slot = 1+k%edges, k/edges
		}
		out[k] = scrapePod{k: k, edge: e, ip: addrAt(podRange(e).Addr(), 2+slot)}
	}
	return out
}

// podObject is p as a Pod: bound to its edge, declaring scrapePort, its
// status Running at p.ip. The bench creates it (the status written with
// a second call) and the load generator's edges know it.
func (p scrapePod) podObject() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.name(), Namespace: scrapeNamespace, Labels: map[string]string{"app": scrapeApp}},
		Spec: corev1.PodSpec{
			NodeName:                     edgeName(p.edge),
			AutomountServiceAccountToken: ptr.To(false),
			Containers: []corev1.Container{{
				Name: "metrics", Image: "scalebench/none",
				Ports: []corev1.ContainerPort{{Name: "metrics", ContainerPort: scrapePort, Protocol: corev1.ProtocolTCP}},
			}},
		},
		Status: corev1.PodStatus{
			Phase:  corev1.PodRunning,
			PodIP:  p.ip.String(),
			PodIPs: []corev1.PodIP{{IP: p.ip.String()}},
			Conditions: []corev1.PodCondition{
				{Type: corev1.PodReady, Status: corev1.ConditionTrue},
			},
		},
	}
}

// staticPods is a simulated edge's pod source: its range and its pods,
// fixed (the real edge reads them through the apiserver, package
// edgeproxy/nodepods).
type staticPods struct {
	ranges []netip.Prefix
	byIP   map[netip.Addr][]*corev1.Pod
}

var _ edgetunnel.PodSource = (*staticPods)(nil)

func (s *staticPods) PodRanges() ([]netip.Prefix, bool) { return s.ranges, true }

func (s *staticPods) PodsByIP(ip netip.Addr) ([]*corev1.Pod, bool) { return s.byIP[ip], true }

// edgePods returns the pod source of each edge 1..edges (index i-1), all
// with their ranges, with pods of the scrape layout of n pods.
func edgePods(edges, n int) []*staticPods {
	out := make([]*staticPods, edges)
	for i := range out {
		out[i] = &staticPods{ranges: []netip.Prefix{podRange(i + 1)}, byIP: map[netip.Addr][]*corev1.Pod{}}
	}
	for _, p := range scrapeLayout(edges, n) {
		out[p.edge-1].byIP[p.ip] = []*corev1.Pod{p.podObject()}
	}
	return out
}

// metricsBody is what every pod serves: a small exposition in
// Prometheus's text format (about 2 KiB, 40 series).
var metricsBody = func() string {
	var b strings.Builder
	b.WriteString("# HELP scalebench_pod_up A simulated edge pod.\n# TYPE scalebench_pod_up gauge\nscalebench_pod_up 1\n")
	b.WriteString("# HELP scalebench_pod_requests_total Requests, by code and handler.\n# TYPE scalebench_pod_requests_total counter\n")
	for i := range 39 {
		fmt.Fprintf(&b, "scalebench_pod_requests_total{code=\"%d\",handler=\"/api/v1/handler-%02d\"} %d\n", 200+i%5, i, 1000+i*37)
	}
	return b.String()
}()

// podMetrics serves every simulated pod's /metrics in the load generator
// (plain HTTP on loopback): the edges' dialer connects the tunnel's pod
// streams to it.
type podMetrics struct {
	ln     net.Listener
	served atomic.Int64
}

func startPodMetrics() (*podMetrics, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("pod metrics: %w", err)
	}
	m := &podMetrics{ln: ln}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/metrics" {
				http.NotFound(w, r)
				return
			}
			m.served.Add(1)
			w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
			fmt.Fprint(w, metricsBody)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go srv.Serve(ln)
	return m, nil
}

// edgeDialer is the simulated edges' dialer: pods' metrics port to the
// pod metrics server, the rest to the stand-in kubelet. The allow list
// decided before it is asked.
type edgeDialer struct {
	kubelet *standInKubelet
	metrics *podMetrics // nil without the scrape phase
}

var _ edgetunnel.Dialer = edgeDialer{}

func (d edgeDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	dest, err := netip.ParseAddrPort(address)
	if err != nil {
		return nil, err
	}
	if d.metrics != nil && dest.Port() == scrapePort && podRanges.Contains(dest.Addr()) {
		var nd net.Dialer
		return nd.DialContext(ctx, "tcp", d.metrics.ln.Addr().String())
	}
	return d.kubelet.DialContext(ctx, network, address)
}

// scrapeResult is the scrape phase.
type scrapeResult struct {
	pods, edges int // pods, on this many edges
	discovered  int // targets Prometheus found
	upAt        time.Duration
	allUp       bool // every target up before the window
	window      time.Duration
	// From Prometheus, over the window: one sample of
	// scrape_duration_seconds and of up per scrape.
	scrapes, failed int
	durations       []time.Duration // sorted
	// slow: scrapes over slowScrape, in slowSeconds distinct seconds of
	// the window (a stall of the machine or a process shows as many in
	// few seconds), at most slowWorst in one.
	slow, slowSeconds, slowWorst int
	upEnd                        int           // targets whose last scrape in the window succeeded
	baseline                     time.Duration // length of each baseline
	// baselinePct is the gateway's CPU without scrapes, % of a core: the
	// mean of the baselines before Prometheus starts and after it stops
	// (baseBefore, baseAfter; -1 not measured).
	baselinePct, baseBefore, baseAfter float64
	// gcPerMin: the gateway's garbage collections per minute in the
	// baseline before, the window, the baseline after (-1 unknown).
	gcPerMin [3]float64
	cpu      time.Duration // gateway CPU in the window
	agentCPU time.Duration
	promCPU  time.Duration
	served   int64   // /metrics answered by the load generator in the window
	relayed  float64 // connections the gateway's transparent listener finished in the window
	active   float64 // and held open at its end
	// ended: the edges' tunnel connections that ended in the window, by
	// reason (a pod's scrapes fail until its edge is back).
	ended    map[string]int64
	firstErr string
}

// slowScrape: scrapes longer are counted by second of the window.
const slowScrape = 100 * time.Millisecond

func (r *scrapeResult) cpuPct() float64 { return 100 * r.cpu.Seconds() / r.window.Seconds() }

// cpuPerScrape is the gateway's CPU in the window over the scrapes, all of
// it (gross) or less the baseline's rate (net), in ms.
func (r *scrapeResult) cpuPerScrape() (gross, net float64) {
	if r.scrapes == 0 {
		return -1, -1
	}
	idle := r.baselinePct / 100 * r.window.Seconds()
	return 1000 * r.cpu.Seconds() / float64(r.scrapes), 1000 * (r.cpu.Seconds() - idle) / float64(r.scrapes)
}

// scrape runs the scrape phase on the fleet connected to replica 0.
func (b *bench) scrape(ctx context.Context, res *results) error {
	g := b.gws[0]
	if g == nil {
		return errors.New("no gateway running")
	}
	layout := scrapeLayout(b.o.edges, b.o.scrapePods)
	r := &scrapeResult{pods: len(layout), edges: min(b.o.edges, len(layout))}
	res.scrape = r
	note("scrape: the load generator stands in for each edge's pod side: the edge tunnel's real allow list over an in-memory list " +
		"of the node's pods, one /metrics server for every pod; the real edge's pod lookup (nodepods) and pods are not measured here")
	if err := b.createScrapePods(ctx, layout); err != nil {
		return err
	}
	b.w.RouteVia(b.s, podRanges, b.w.Gateways[0])
	first := layout[0]
	url := fmt.Sprintf("http://%s/metrics", netip.AddrPortFrom(first.ip, scrapePort))
	if err := b.podWarmUp(ctx, url); err != nil {
		return err
	}

	r.baseBefore, r.baseAfter, r.gcPerMin = -1, -1, [3]float64{-1, -1, -1}
	var err error
	if r.baseBefore, r.gcPerMin[0], err = b.scrapeBaseline(ctx, g, "before Prometheus"); err != nil {
		return err
	}
	r.baselinePct, r.baseline = r.baseBefore, b.o.scrapeBaseline

	cfg, err := b.prometheusConfig()
	if err != nil {
		return err
	}
	promStart := time.Now()
	prom := testenv.StartPrometheus(b.s, b.w.Client, cfg)
	stopped := false
	stopProm := func() {
		if !stopped {
			stopped = true
			b.w.Client.Stop(prom.Cmd)
		}
	}
	defer stopProm()
	promPID, err := benchkit.RealPID(ctx, prom.Cmd.Process.Pid, testenv.Binaries(b.s).Prometheus)
	if err != nil {
		return err
	}
	note("scrape: Prometheus on %s, kubernetes_sd (role pod) of %d pods on %d edges, every %v", b.w.Client.Label, r.pods, r.edges, b.o.scrapeInterval)
	b.waitTargetsUp(ctx, prom, r, promStart)

	b.profile(ctx, g, "scrape", b.o.scrapeDuration)
	m0, err := world.Get(ctx, g.host, world.GatewayAdmin(g.host, "/metrics"))
	if err != nil {
		return err
	}
	st0, _ := b.agent.stats(ctx)
	cpu0, agent0, prom0, t0 := benchkit.CPU(g.pid), benchkit.CPU(b.agent.pid), benchkit.CPU(promPID), time.Now()
	stop := benchkit.Progress(ctx, 30*time.Second, func() {
		el := time.Since(t0)
		note("scrape: %v/%v, gateway CPU %.1f%% of a core", el.Round(time.Second), b.o.scrapeDuration, 100*(benchkit.CPU(g.pid)-cpu0).Seconds()/el.Seconds())
	})
	err = benchkit.Sleep(ctx, b.o.scrapeDuration)
	stop()
	if err != nil {
		return err
	}
	cpu1, agent1, prom1, t1 := benchkit.CPU(g.pid), benchkit.CPU(b.agent.pid), benchkit.CPU(promPID), time.Now()
	r.window = t1.Sub(t0)
	r.cpu, r.agentCPU, r.promCPU = cpu1-cpu0, agent1-agent0, prom1-prom0
	if st1, err := b.agent.stats(ctx); err == nil {
		r.served = st1.Scraped - st0.Scraped
		r.ended = map[string]int64{}
		for reason, n := range st1.Disconnects {
			if d := n - st0.Disconnects[reason]; d > 0 {
				r.ended[reason] = d
			}
		}
	}
	if m1, err := world.Get(ctx, g.host, world.GatewayAdmin(g.host, "/metrics")); err == nil {
		relayed := `tether_gateway_proxy_connections_total{result="relayed"}`
		r.relayed = world.Metric(m1, relayed) - world.Metric(m0, relayed)
		r.active = world.Metric(m1, "tether_gateway_proxy_active_connections")
		r.gcPerMin[1] = gcRate(m0, m1, r.window)
	}
	if err := r.read(ctx, prom, t1); err != nil {
		return err
	}
	if r.failed > 0 {
		r.lastErrors(ctx, prom)
	}
	// Prometheus's connections end with it: the gateway is left as the
	// phase found it, which the health marks check.
	stopProm()
	b.waitRelaysClosed(ctx, g)
	if r.baseAfter, r.gcPerMin[2], err = b.scrapeBaseline(ctx, g, "after Prometheus"); err != nil {
		return err
	}
	r.baselinePct = (r.baseBefore + r.baseAfter) / 2
	gross, net := r.cpuPerScrape()
	note("scrape: %d scrapes in %v (%d failed), p50 %s ms, p99 %s ms; gateway CPU %.1f%% of a core, %.3f ms per scrape (%.3f ms above the baseline)",
		r.scrapes, r.window.Round(time.Second), r.failed, ms(benchkit.Pct(r.durations, 50)), ms(benchkit.Pct(r.durations, 99)), r.cpuPct(), gross, net)
	return nil
}

// scrapeBaseline measures g's CPU for --scrape-baseline, in % of a core,
// and its garbage collections per minute meanwhile (-1 unknown).
func (b *bench) scrapeBaseline(ctx context.Context, g *gwProc, when string) (pct, gc float64, err error) {
	note("scrape: baseline %s: the gateway's CPU for %v without scrapes", when, b.o.scrapeBaseline)
	m0, err := world.Get(ctx, g.host, world.GatewayAdmin(g.host, "/metrics"))
	if err != nil {
		return -1, -1, err
	}
	cpu0, t0 := benchkit.CPU(g.pid), time.Now()
	if err := benchkit.Sleep(ctx, b.o.scrapeBaseline); err != nil {
		return -1, -1, err
	}
	took := time.Since(t0)
	pct = 100 * (benchkit.CPU(g.pid) - cpu0).Seconds() / took.Seconds()
	gc = -1
	if m1, err := world.Get(ctx, g.host, world.GatewayAdmin(g.host, "/metrics")); err == nil {
		gc = gcRate(m0, m1, took)
	}
	note("scrape: baseline %s: %.1f%% of a core, %.1f garbage collections a minute", when, pct, gc)
	return pct, gc, nil
}

// gcRate is the garbage collections per minute between two expositions
// of the gateway's /metrics taken d apart.
func gcRate(m0, m1 string, d time.Duration) float64 {
	const cycles = "go_gc_duration_seconds_count"
	return (world.Metric(m1, cycles) - world.Metric(m0, cycles)) / d.Minutes()
}

// createScrapePods creates the pods of layout and writes their status, as
// the admin (no kubelet runs them).
func (b *bench) createScrapePods(ctx context.Context, layout []scrapePod) error {
	c := b.admin.CoreV1()
	// The ServiceAccount admission wants the namespace's default account;
	// no controller makes it in this world.
	_, err := c.ServiceAccounts(scrapeNamespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create service account: %w", err)
	}
	note("scrape: creating %d pods on %d edges (addresses from %s, port %d declared)", len(layout), min(b.o.edges, len(layout)), layout[0].ip, scrapePort)
	start := time.Now()
	err = benchkit.Parallel(ctx, b.o.createParallel, len(layout), func(k int) error {
		want := layout[k].podObject()
		p, err := c.Pods(scrapeNamespace).Create(ctx, want, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("create pod %s: %w", want.Name, err)
		}
		p.Status = want.Status
		if _, err := c.Pods(scrapeNamespace).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("set status of pod %s: %w", want.Name, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	note("scrape: %d pods created and Running in %v", len(layout), time.Since(start).Round(100*time.Millisecond))
	return nil
}

// podWarmUp retries a GET of url from the client host until it answers
// (the gateway has routed the pod ranges), for up to a minute; each on a
// connection of its own, closed after it.
func (b *bench) podWarmUp(ctx context.Context, url string) error {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: b.w.Client.DialContext, DisableKeepAlives: true}}
	deadline := time.Now().Add(time.Minute)
	for {
		body, err := benchkit.Get(ctx, c, url)
		if err == nil && string(body) != metricsBody {
			err = fmt.Errorf("body %.80q", body)
		}
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("GET %s from %s through the gateway, for a minute: %w", url, b.w.Client.Label, err)
		}
		if err := benchkit.Sleep(ctx, 500*time.Millisecond); err != nil {
			return err
		}
	}
}

// waitRelaysClosed waits, up to 30 s, until g relays no client
// connection.
func (b *bench) waitRelaysClosed(ctx context.Context, g *gwProc) {
	deadline := time.Now().Add(30 * time.Second)
	active := -1.0
	for time.Now().Before(deadline) && ctx.Err() == nil {
		m, err := world.Get(ctx, g.host, world.GatewayAdmin(g.host, "/metrics"))
		if err == nil {
			if active = world.Metric(m, "tether_gateway_proxy_active_connections"); active == 0 {
				return
			}
		}
		benchkit.Sleep(ctx, 500*time.Millisecond)
	}
	note("scrape: the gateway still relays %.0f connections 30 s after Prometheus stopped", active)
}

// prometheusConfig is Prometheus's configuration: one job over the
// scrape pods found by kubernetes_sd (role pod), each declared port at
// the pod's address, as a cluster's Prometheus scrapes pods. It lists
// pods with a client certificate of its own (system:masters: reading is
// all it does).
func (b *bench) prometheusConfig() (string, error) {
	kp, err := b.w.ClusterCA.ClientCert(promUser, "system:masters")
	if err != nil {
		return "", err
	}
	cert, key, err := kp.WriteFiles(b.w.Dir, promUser)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf(`global:
  scrape_interval: %[1]s
  scrape_timeout: %[2]s
scrape_configs:
  - job_name: %[3]s
    kubernetes_sd_configs:
      - role: pod
        api_server: %[4]q
        tls_config: {ca_file: %[5]q, cert_file: %[6]q, key_file: %[7]q}
        namespaces: {names: [%[8]s]}
        selectors: [{role: pod, label: "app=%[9]s"}]
    relabel_configs:
      - {source_labels: [__meta_kubernetes_pod_container_port_number], regex: ".+", action: keep}
      - {source_labels: [__meta_kubernetes_pod_ip, __meta_kubernetes_pod_container_port_number], regex: "(.+);(.+)", target_label: __address__, replacement: "$1:$2"}
      - {source_labels: [__meta_kubernetes_pod_name], target_label: pod}
      - {source_labels: [__meta_kubernetes_pod_node_name], target_label: node}
`, promDuration(b.o.scrapeInterval), promDuration(min(b.o.scrapeInterval, 10*time.Second)), scrapeJob,
		b.w.CP.URL, b.w.Path("cluster-ca.crt"), cert, key, scrapeNamespace, scrapeApp), nil
}

// promDuration is d in Prometheus's duration syntax.
func promDuration(d time.Duration) string { return fmt.Sprintf("%dms", d.Milliseconds()) }

// waitTargetsUp waits until Prometheus has found every pod and scraped
// each successfully (health up), or --register-timeout has passed since
// its start.
func (b *bench) waitTargetsUp(ctx context.Context, prom *testenv.Prometheus, r *scrapeResult, since time.Time) {
	lastNote := time.Now()
	for ctx.Err() == nil {
		targets, err := prom.Targets(ctx)
		up := 0
		for _, t := range targets {
			if t.Health == "up" {
				up++
			} else if t.LastError != "" && r.firstErr == "" {
				r.firstErr = fmt.Sprintf("%s: %s", t.ScrapeURL, t.LastError)
			}
		}
		r.discovered = len(targets)
		if err == nil && up >= r.pods {
			r.upAt, r.allUp = time.Since(since), true
			note("scrape: all %d targets up %v after Prometheus started", up, r.upAt.Round(time.Second))
			return
		}
		if time.Since(since) > b.o.registerWait {
			note("scrape: %d of %d targets found, %d up after %v; measuring anyway", len(targets), r.pods, up, b.o.registerWait)
			return
		}
		if time.Since(lastNote) >= 10*time.Second {
			lastNote = time.Now()
			note("scrape: %v: %d of %d targets found, %d up", time.Since(since).Round(time.Second), len(targets), r.pods, up)
		}
		benchkit.Sleep(ctx, time.Second)
	}
}

// lastErrors notes the last error of each target down at the end.
func (r *scrapeResult) lastErrors(ctx context.Context, prom *testenv.Prometheus) {
	targets, err := prom.Targets(ctx)
	if err != nil {
		return
	}
	for _, t := range targets {
		if t.Health != "up" && t.LastError != "" {
			note("scrape: %s: %s", t.ScrapeURL, t.LastError)
			if r.firstErr == "" {
				r.firstErr = fmt.Sprintf("%s: %s", t.ScrapeURL, t.LastError)
			}
		}
	}
}

// read takes the window's scrapes from Prometheus: every sample of
// scrape_duration_seconds and up of the job in the window ending at end.
func (r *scrapeResult) read(ctx context.Context, prom *testenv.Prometheus, end time.Time) error {
	sel := fmt.Sprintf(`{job=%q}[%s]`, scrapeJob, promDuration(r.window))
	durs, err := prom.Samples(ctx, "scrape_duration_seconds"+sel, end)
	if err != nil {
		return err
	}
	slowAt := map[int64]int{} // second → slow scrapes
	for _, s := range durs {
		for _, p := range s.Points {
			d := time.Duration(p.Value * float64(time.Second))
			r.durations = append(r.durations, d)
			if d > slowScrape {
				r.slow++
				slowAt[p.Time.Unix()]++
			}
		}
	}
	r.slowSeconds = len(slowAt)
	for _, n := range slowAt {
		r.slowWorst = max(r.slowWorst, n)
	}
	slices.Sort(r.durations)
	r.scrapes = len(r.durations)
	ups, err := prom.Samples(ctx, "up"+sel, end)
	if err != nil {
		return err
	}
	for _, s := range ups {
		for _, p := range s.Points {
			if p.Value != 1 {
				r.failed++
			}
		}
		if n := len(s.Points); n > 0 && s.Points[n-1].Value == 1 {
			r.upEnd++
		}
	}
	return nil
}
