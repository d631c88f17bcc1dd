package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/e2e/benchplot"
	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// Addresses: edge i is edgeBase+i, the churn phase's node k churnBase+k;
// the gateways route both (--edge-cidrs edgeCIDRs), the cloud client
// routes them to the gateway.
var (
	edgeBase  = netip.MustParseAddr("172.16.0.0")
	churnBase = netip.MustParseAddr("172.17.0.0")
	edgeCIDRs = netip.MustParsePrefix("172.16.0.0/15")
)

const (
	maxEdges  = 60000 // edgeBase+maxEdges stays in 172.16.0.0/16
	maxChurn  = 60000
	fleetSite = "fleet"
	loadgen   = "loadgen"
)

type bench struct {
	o     options
	s     *testenv.Session
	w     *world.World
	bins  world.Binaries
	admin kubernetes.Interface // the admin identity, without client-side throttling to speak of
	agent *agentClient
	gws   []*gwProc // by replica index; nil while not running
	route *routeClient
	all   []int // 1..edges

	gwArgs    [][]string // by replica index, once started
	logs      []procLog
	profiling sync.Mutex // held while a CPU profile is taken
}

// gwProc is a running tether-gateway.
type gwProc struct {
	host    *testenv.Host
	cmd     *exec.Cmd
	pid     int
	started time.Time
}

func setup(ctx context.Context, s *testenv.Session, o options) (*bench, error) {
	start := time.Now()
	bins, err := world.BenchBinaries(s, o.binDir, note, "tether-gateway")
	if err != nil {
		return nil, err
	}
	logf := func(string, ...any) {}
	if o.verbose {
		logf = func(format string, args ...any) { s.Log.Info(fmt.Sprintf(format, args...)) }
	}
	gateways := 1
	if o.phases.has("routing") && o.edges >= 2 {
		gateways = 2 // the routing phase's one-edge replica (routing.go)
	}
	if o.phases.has("replicas") {
		gateways = 3
	}
	note("building the world: control plane, %d gateway host(s), site %s with the load generator host", gateways, fleetSite)
	testenv.Binaries(s)
	kubeletCA := testenv.MustCA(s, "kubelet-serving-ca")
	w := world.New(s, bins, world.Options{Gateways: gateways, KubeletCA: kubeletCA, Sites: []testenv.SiteSpec{
		{Name: fleetSite, Hosts: []string{loadgen}, LAN: netip.MustParsePrefix("192.168.50.0/24")},
	}}, logf)
	cfg := rest.CopyConfig(w.CP.Admin)
	cfg.QPS, cfg.Burst = 5000, 5000
	admin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	b := &bench{o: o, s: s, w: w, bins: bins, admin: admin, gws: make([]*gwProc, gateways), gwArgs: make([][]string, gateways)}
	for i := 1; i <= o.edges; i++ {
		b.all = append(b.all, i)
	}
	// The world made a Node for the load generator's host, as for any
	// edge host; the fleet's Nodes are the simulated edges'.
	if err := admin.CoreV1().Nodes().Delete(ctx, loadgen, metav1.DeleteOptions{}); err != nil {
		return nil, fmt.Errorf("delete node %s: %w", loadgen, err)
	}
	lg := w.Topo.Sites[0].Hosts[0]
	// Up to three replicas × --edges UDP sockets: widen the ephemeral
	// port range of the load generator's namespace.
	if err := lg.Sysctl("net.ipv4.ip_local_port_range", "1024 65535"); err != nil {
		return nil, err
	}
	if err := b.createFleet(ctx); err != nil {
		return nil, err
	}
	var agentCmd *exec.Cmd
	if b.agent, agentCmd, err = startAgent(ctx, s, w, lg, o); err != nil {
		return nil, err
	}
	b.logs = append(b.logs, procLog{"loadgen", lg, agentCmd})
	w.RouteVia(s, edgeCIDRs, w.Gateways[0])
	b.route = newRouteClient(w.Client.DialContext, kubeletCA.Pool())
	note("world ready in %v", time.Since(start).Round(time.Second))
	return b, nil
}

// gatewayAddr is the tunnel address of replica i, as edges dial it.
func (b *bench) gatewayAddr(i int) string {
	return fmt.Sprintf("%s:%d", b.w.Gateways[i].Addr, world.TunnelPort)
}

// startGateway starts replica i. Its flags, serving certificate
// included, are the same at every start, as a restarted deployment's are:
// the QUIC stateless reset key derives from the serving key, so a
// restarted gateway resets the edges' old connections at once.
func (b *bench) startGateway(ctx context.Context, i int) (*gwProc, error) {
	h := b.w.Gateways[i]
	if b.gwArgs[i] == nil {
		b.gwArgs[i] = append(b.w.GatewayArgs(h, b.s),
			"--netrules", "nftables", "--log-level", "info",
			"--edge-cidrs", edgeCIDRs.String(), "--dns-zone", world.Zone,
			"--profiling", "--replica", h.Label, "--shutdown-grace", "1s",
			// The heartbeats phase's election records are written once,
			// with an hour's lease, for leaders that never renew them.
			"--pool-lease-duration", "1h")
		if b.o.phases.has("scrape") {
			b.gwArgs[i] = append(b.gwArgs[i], "--edge-pod-cidrs", podRanges.String())
		}
		b.gwArgs[i] = append(b.gwArgs[i], b.o.gatewayArgs...)
	}
	started := time.Now()
	name, args := pinned(b.o.gatewayCPUs, b.bins.Gateway, b.gwArgs[i]...)
	cmd := h.Start(b.s, name, args...)
	b.logs = append(b.logs, procLog{h.Label, h, cmd})
	pid, err := benchkit.RealPID(ctx, cmd.Process.Pid, b.bins.Gateway)
	if err != nil {
		return nil, err
	}
	g := &gwProc{host: h, cmd: cmd, pid: pid, started: started}
	b.gws[i] = g
	return g, nil
}

// killGateway ends replica i with SIGKILL: no goodbye to the edges.
func (b *bench) killGateway(i int) error {
	g := b.gws[i]
	b.gws[i] = nil
	if err := syscall.Kill(-g.cmd.Process.Pid, syscall.SIGKILL); err != nil {
		return err
	}
	g.host.Wait(context.Background(), g.cmd)
	return nil
}

// stopGateway stops replica i (SIGTERM; SIGKILL after testenv's grace
// period). How it exited does not matter here.
func (b *bench) stopGateway(i int) error {
	g := b.gws[i]
	b.gws[i] = nil
	g.host.Stop(g.cmd)
	return nil
}

// procLog is the log of a process the bench started.
type procLog struct {
	name string
	host *testenv.Host
	cmd  *exec.Cmd
}

// saveLogs copies the logs of the gateways and the load generator into
// --log-dir.
func (b *bench) saveLogs() {
	if b.o.logDir == "" {
		return
	}
	if err := os.MkdirAll(b.o.logDir, 0o755); err != nil {
		note("--log-dir: %v", err)
		return
	}
	for i, l := range b.logs {
		name := filepath.Join(b.o.logDir, fmt.Sprintf("%02d-%s.log", i+1, l.name))
		if err := os.WriteFile(name, []byte(l.host.Log(l.cmd)), 0o644); err != nil {
			note("--log-dir: %v", err)
		}
	}
	note("logs in %s", b.o.logDir)
}

// regResult is a wait for edges to register on a gateway.
type regResult struct {
	want, reached int
	took          time.Duration // from the gateway's start
	peakRSS       int64
	cpu           time.Duration // the gateway's CPU time meanwhile
	peakRate      float64       // registrations per second, best 1 s sample
	agentCPU      time.Duration // the load generator's CPU time meanwhile
	// udpDrops: datagrams dropped for a full receive buffer in the
	// gateway's namespace meanwhile (RcvbufErrors).
	udpDrops int64
	// curve: edges registered (Y) against seconds from the gateway's
	// start (X), a point a poll (about every second), for the plots.
	curve []benchplot.XY
}

func (r regResult) all() bool { return r.reached >= r.want }

// waitRegistered polls g's /status until want edges are registered or
// --register-timeout passes, reporting progress; times count from g's
// start. With --profile, the gateway's CPU profile of the first 30 s is
// written as <label>.
func (b *bench) waitRegistered(ctx context.Context, g *gwProc, want int, label string) regResult {
	r := regResult{want: want}
	agentCPU0 := benchkit.CPU(b.agent.pid)
	deadline := g.started.Add(b.o.registerWait)
	lastN, lastT := 0, time.Now()
	lastNote := time.Now()
	profiled := false
	for {
		n, err := registered(ctx, g.host)
		now := time.Now()
		if err == nil {
			if !profiled && b.o.profileDir != "" {
				profiled = true
				b.profile(ctx, g, label, 30*time.Second)
			}
			if dt := now.Sub(lastT).Seconds(); dt > 0 && n > lastN {
				r.peakRate = max(r.peakRate, float64(n-lastN)/dt)
			}
			lastN, lastT = n, now
			r.reached = n
			r.curve = append(r.curve, benchplot.XY{X: now.Sub(g.started).Seconds(), Y: float64(n)})
		}
		m, _ := benchkit.ReadMem(g.pid)
		r.peakRSS = max(r.peakRSS, m.HWM)
		r.took = now.Sub(g.started)
		r.cpu = benchkit.CPU(g.pid) // all of it: g started for this wait
		if r.all() || now.After(deadline) || ctx.Err() != nil {
			r.agentCPU = benchkit.CPU(b.agent.pid) - agentCPU0
			return r
		}
		if now.Sub(lastNote) >= 5*time.Second {
			lastNote = now
			note("%s: %v: %d/%d registered on %s, RSS %s MiB, CPU %.0f%% of a core (load generator %.0f%%)", label, r.took.Round(time.Second),
				r.reached, want, g.host.Label, mib(m.RSS), 100*r.cpu.Seconds()/r.took.Seconds(),
				100*(benchkit.CPU(b.agent.pid)-agentCPU0).Seconds()/time.Since(g.started).Seconds())
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// connectedAtEnd is how many edges the first replica has registered.
func (b *bench) connectedAtEnd(ctx context.Context) int {
	if b.gws[0] == nil {
		return 0
	}
	n, err := registered(ctx, b.gws[0].host)
	if err != nil {
		return 0
	}
	return n
}

// createFleet creates the Nodes of the simulated edges.
func (b *bench) createFleet(ctx context.Context) error {
	ranges := ""
	if b.o.phases.has("scrape") {
		ranges = fmt.Sprintf(", pod ranges from %s", podRange(1))
	}
	note("creating %d Nodes (edge-1..edge-%d, pools of %d, InternalIPs from %s%s)", b.o.edges, b.o.edges, poolSize, addrAt(edgeBase, 1), ranges)
	start := time.Now()
	var done int64
	var mu sync.Mutex
	stop := benchkit.Progress(ctx, 5*time.Second, func() {
		mu.Lock()
		n := done
		mu.Unlock()
		note("nodes: %d/%d created (%.0f/s)", n, b.o.edges, float64(n)/time.Since(start).Seconds())
	})
	defer stop()
	err := benchkit.Parallel(ctx, b.o.createParallel, b.o.edges, func(k int) error {
		i := k + 1
		var pods netip.Prefix
		if b.o.phases.has("scrape") {
			pods = podRange(i)
		}
		if err := createNode(ctx, b.admin, edgeName(i), edgeAddr(i), poolOf(i), pods); err != nil {
			return err
		}
		mu.Lock()
		done++
		mu.Unlock()
		return nil
	})
	if err != nil {
		return err
	}
	note("nodes: %d created in %v", b.o.edges, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// createNode creates an edge Node with its InternalIP, as a kubelet
// registers one (status included in the create), and, if valid, the pod
// range pods in spec.podCIDRs, as the control plane's node IPAM writes it.
func createNode(ctx context.Context, c kubernetes.Interface, name string, addr netip.Addr, pool string, pods netip.Prefix) error {
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{
			world.EdgeLabel: "true", world.PoolLabel: pool, corev1.LabelHostname: name,
		}},
		Status: corev1.NodeStatus{
			Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: addr.String()},
				{Type: corev1.NodeHostName, Address: name},
			},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: world.KubeletPort}},
		},
	}
	if pods.IsValid() {
		n.Spec.PodCIDR, n.Spec.PodCIDRs = pods.String(), []string{pods.String()}
	}
	created, err := c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create node %s: %w", name, err)
	}
	if len(created.Status.Addresses) == 0 { // the status was dropped: set it
		created.Status = n.Status
		if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("set addresses of node %s: %w", name, err)
		}
	}
	return nil
}

// agentClient drives the load generator over its unix socket.
type agentClient struct {
	c   *http.Client
	pid int
}

// startAgent starts the load generator in h and waits until it has issued
// every edge's certificate and answers.
func startAgent(ctx context.Context, s *testenv.Session, w *world.World, h *testenv.Host, o options) (_ *agentClient, _ *exec.Cmd, err error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, err
	}
	cfg := agentConfig{
		Socket:        w.Path("agent.sock"),
		Edges:         o.edges,
		ClusterCACert: w.ClusterCA.CertPEM,
		KubeletCACert: w.KubeletCA.CertPEM,
		GatewayCACert: w.GatewayCA.CertPEM,
		LogLevel:      o.agentLogLevel,
	}
	if o.phases.has("scrape") {
		cfg.ScrapePods = o.scrapePods
	}
	if cfg.ClusterCAKey, err = testenv.MarshalKeyPEM(w.ClusterCA.Key); err != nil {
		return nil, nil, err
	}
	if cfg.KubeletCAKey, err = testenv.MarshalKeyPEM(w.KubeletCA.Key); err != nil {
		return nil, nil, err
	}
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, nil, err
	}
	path := filepath.Join(w.Dir, "agent.json")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		return nil, nil, err
	}
	note("starting the load generator in %s: %d simulated edges (issuing their client certificates), on CPUs %q", h.Label, o.edges, o.loadgenCPUs)
	name, args := pinned(o.loadgenCPUs, exe, agentArg, path)
	cmd := h.Start(s, name, args...)
	a := &agentClient{c: &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", cfg.Socket)
		},
	}}}
	if a.pid, err = benchkit.RealPID(ctx, cmd.Process.Pid, exe); err != nil {
		return nil, nil, err
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		if _, err := a.stats(ctx); err == nil {
			return a, cmd, nil
		} else if time.Now().After(deadline) || h.Exited(cmd) {
			return nil, nil, fmt.Errorf("load generator not answering: %v; its log: %s", err, benchkit.Tail(h.Log(cmd), 2000))
		}
		if err := benchkit.Sleep(ctx, 200*time.Millisecond); err != nil {
			return nil, nil, err
		}
	}
}

func (a *agentClient) call(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		raw, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://agent"+path, body)
	if err != nil {
		return err
	}
	resp, err := a.c.Do(req)
	if err != nil {
		return fmt.Errorf("load generator %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("load generator %s: %s: %s", path, resp.Status, bytes.TrimSpace(msg))
	}
	if out == nil {
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

func (a *agentClient) start(ctx context.Context, edges []int, gateways ...string) error {
	return a.call(ctx, http.MethodPost, "/start", edgeRequest{Edges: edges, Gateways: gateways}, nil)
}

func (a *agentClient) stop(ctx context.Context, edges []int) error {
	return a.call(ctx, http.MethodPost, "/stop", edgeRequest{Edges: edges}, nil)
}

func (a *agentClient) stats(ctx context.Context) (agentStats, error) {
	var st agentStats
	err := a.call(ctx, http.MethodGet, "/stats", nil, &st)
	return st, err
}

// profile writes g's CPU profile of the next d as <label>.pprof in
// --profile's directory, in the background.
func (b *bench) profile(ctx context.Context, g *gwProc, label string, d time.Duration) {
	if b.o.profileDir == "" {
		return
	}
	end := time.Now().Add(d)
	go func() {
		// One CPU profile at a time: a phase's waits for the previous
		// phase's to end, and then covers what is left of its own (the
		// gateway may be gone after it).
		b.profiling.Lock()
		defer b.profiling.Unlock()
		left := time.Until(end).Truncate(time.Second)
		if left < 5*time.Second {
			note("profile %s: skipped, the previous phase's profile ran over (almost) all of it", label)
			return
		}
		if left < d {
			note("profile %s: covers its last %v (the previous phase's profile took the rest)", label, left)
		}
		if err := b.fetchProfile(ctx, g, fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(left.Seconds())), label+"-cpu", left+30*time.Second); err != nil {
			note("profile %s: %v", label, err)
		}
	}()
}

// fetchProfile saves g's admin endpoint path into --profile's directory as
// gateway-<name>.pprof.
func (b *bench) fetchProfile(ctx context.Context, g *gwProc, path, name string, timeout time.Duration) error {
	if err := os.MkdirAll(b.o.profileDir, 0o755); err != nil {
		return err
	}
	return benchkit.SaveURL(ctx, g.host.DialContext, world.GatewayAdmin(g.host, path), filepath.Join(b.o.profileDir, "gateway-"+name+".pprof"), timeout)
}
