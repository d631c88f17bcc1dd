package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/e2e/benchplot"
	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// Bounds of the steps that are not measured.
const (
	readyBound   = 2 * time.Minute // a kubelet's Node Ready
	runBound     = 3 * time.Minute // every pod running online
	offlineBound = time.Minute     // tether-edge noticing the cut
	flushDelay   = 2 * time.Second // the audit log catching up with a window's end
	cacheSettle  = 10 * time.Second
)

// results are the figures of a run.
type results struct {
	pods int
	// steady are each mode's requests in the steady window.
	steady       map[string][]world.AuditRequest
	steadyWindow time.Duration
	// edgeOnline and edgeOffline are tether-edge's on edge-1.
	edgeOnline, edgeOffline procSample
	offlineAfter            time.Duration // the cut to tether-edge serving from its cache
	restart                 map[string]restart
	restartWindow           time.Duration
	offline, offlineNoToken runResult
}

// procSample is a process's memory at the end of a window and the CPU it
// used over it.
type procSample struct {
	mem    benchkit.Mem
	cpu    time.Duration
	window time.Duration
}

func (p procSample) cpuPct() float64 {
	if p.window <= 0 {
		return 0
	}
	return 100 * p.cpu.Seconds() / p.window.Seconds()
}

// restart is an online restart of one mode's kubelet.
type restart struct {
	run  runResult
	reqs []world.AuditRequest // in the window after the start
	at   time.Time            // the new kubelet's start
}

func run(ctx context.Context, s *testenv.Session, o options, out *benchplot.Out) error {
	printHeader(o, out.Dir)
	setup := time.Now()
	bins, err := world.BenchBinaries(s, o.binDir, note, "tether-edge", "tether-gateway")
	if err != nil {
		return err
	}
	testenv.Binaries(s)
	auditDir, err := os.MkdirTemp("", "kubeletbench-audit-")
	if err != nil {
		return err
	}
	s.Cleanup(func() { os.RemoveAll(auditDir) })
	audit, err := world.NewAuditLog(auditDir)
	if err != nil {
		return err
	}
	note("building the world: control plane with an audit log, sites shop (edge-1, through tether-edge) and kiosk (edge-2, straight)")
	w := world.New(s, bins, world.Options{
		Sites: []testenv.SiteSpec{
			{Name: "shop", Hosts: []string{"edge-1"}, LAN: netip.MustParsePrefix("192.168.9.0/24")},
			{Name: "kiosk", Hosts: []string{"edge-2"}, LAN: netip.MustParsePrefix("192.168.10.0/24")},
		},
		APIServerArgs: audit.Args,
	}, s.Logf)
	w.ApplyEdgeRBAC(s)
	w.StartGateway(s, w.Gateways[0])
	through := &node{s: s, w: w, bins: bins, e: w.Edge("edge-1")}
	straight := &node{s: s, w: w, bins: bins, e: w.Edge("edge-2")}
	through.startEdge()
	res := &results{pods: o.pods, restart: map[string]restart{}, restartWindow: o.restartWindow}

	note("starting the hollow kubelets (through tether-edge on edge-1, straight on edge-2) and %d pods on each", o.pods)
	for _, n := range []*node{through, straight} {
		start := n.startKubelet(n == straight)
		if err := n.waitReady(ctx, start, readyBound); err != nil {
			return err
		}
		if err := n.createPods(ctx, n.e.Name, o.pods, false); err != nil {
			return err
		}
	}
	for _, n := range []*node{through, straight} {
		if err := waitOnline(ctx, n, time.Now()); err != nil {
			return err
		}
	}
	note("world ready and every pod running in %v", time.Since(setup).Round(time.Second))

	// 1. Steady state online.
	note("steady: waiting %v, then counting requests for %v", o.settle, o.steady)
	if err := benchkit.Sleep(ctx, o.settle); err != nil {
		return err
	}
	var steady procWindow
	if err := steady.begin(ctx, through); err != nil {
		return err
	}
	from := time.Now()
	if err := benchkit.Sleep(ctx, o.steady); err != nil {
		return err
	}
	to := time.Now()
	if res.edgeOnline, err = steady.end(); err != nil {
		return err
	}
	if err := benchkit.Sleep(ctx, flushDelay); err != nil {
		return err
	}
	res.steady, res.steadyWindow = map[string][]world.AuditRequest{}, to.Sub(from)
	for _, n := range []*node{through, straight} {
		if res.steady[n.mode()], err = audit.Requests(world.NodeUser(n.e.Name), from, to); err != nil {
			return err
		}
	}

	// 2. Online restart, both kubelets at once.
	note("online restart: killing both kubelets and starting them again")
	for _, n := range []*node{through, straight} {
		if err := n.k.Kill(); err != nil {
			return err
		}
	}
	started := map[*node]time.Time{}
	for _, n := range []*node{through, straight} {
		started[n] = n.startKubelet(n.k.Straight)
	}
	runs := map[*node]runResult{}
	var mu sync.Mutex
	err = parallel([]*node{through, straight}, func(n *node) error {
		r, err := n.waitRunning(ctx, started[n], runBound)
		mu.Lock()
		runs[n] = r
		mu.Unlock()
		return err
	})
	if err != nil {
		return err
	}
	last := started[through]
	if started[straight].After(last) {
		last = started[straight]
	}
	if err := benchkit.Sleep(ctx, time.Until(last.Add(o.restartWindow+flushDelay))); err != nil {
		return err
	}
	for _, n := range []*node{through, straight} {
		reqs, err := audit.Requests(world.NodeUser(n.e.Name), started[n], started[n].Add(o.restartWindow))
		if err != nil {
			return err
		}
		res.restart[n.mode()] = restart{run: runs[n], reqs: reqs, at: started[n]}
	}

	// 3. edge-2 behind tether-edge too, with pods without a token; then
	// both sites cut.
	note("offline: edge-2's kubelet through tether-edge with %d pods without a service-account token", o.pods)
	noToken := straight
	if err := noToken.k.Kill(); err != nil {
		return err
	}
	if err := noToken.deletePods(ctx); err != nil {
		return err
	}
	noToken.startEdge()
	start := noToken.startKubelet(false)
	if err := noToken.waitReady(ctx, start, readyBound); err != nil {
		return err
	}
	if err := noToken.createPods(ctx, noToken.e.Name+"-notoken", o.pods, true); err != nil {
		return err
	}
	if err := waitOnline(ctx, noToken, start); err != nil {
		return err
	}
	if err := benchkit.Sleep(ctx, cacheSettle); err != nil {
		return err
	}
	note("offline: cutting both sites' uplinks; tether-edge's CPU on edge-1 over %v", o.offlineWindow)
	cut := time.Now()
	through.e.CutUplink(s)
	noToken.e.CutUplink(s)
	if err := waitOffline(ctx, through); err != nil {
		return err
	}
	res.offlineAfter = time.Since(cut)
	if err := waitOffline(ctx, noToken); err != nil {
		return err
	}
	var offline procWindow
	if err := offline.begin(ctx, through); err != nil {
		return err
	}
	if err := benchkit.Sleep(ctx, o.offlineWindow); err != nil {
		return err
	}
	if res.edgeOffline, err = offline.end(); err != nil {
		return err
	}

	// 4. Offline restarts: the power cut.
	for _, c := range []struct {
		n   *node
		r   *runResult
		how string
	}{{noToken, &res.offlineNoToken, "without"}, {through, &res.offline, "with"}} {
		note("offline restart of %s (pods %s a service-account token): killing kubelet and tether-edge, starting both with the uplink cut", c.n.e.Name, c.how)
		if *c.r, err = c.n.offlineRestart(ctx, o.offlineBound); err != nil {
			return err
		}
		note("offline restart of %s: %v", c.n.e.Name, *c.r)
	}

	printReport(o, res)
	if err := out.Plots(charts(res)); err != nil {
		note("%v", err)
	}
	fmt.Printf("\nload average at end: %s\n", world.LoadAvg())
	printSummary(res)
	return nil
}

// waitOnline waits until the node's kubelet runs every pod and the cloud
// sees each Running.
func waitOnline(ctx context.Context, n *node, start time.Time) error {
	r, err := n.waitRunning(ctx, start, runBound)
	if err != nil {
		return err
	}
	if !r.all {
		return fmt.Errorf("%s online: %v (%v)", n.e.Name, r, r.reasons)
	}
	ctx, cancel := context.WithTimeout(ctx, runBound)
	defer cancel()
	for {
		list, err := n.w.CP.Client.CoreV1().Pods(n.ns).List(ctx, metav1.ListOptions{})
		running := 0
		if err == nil {
			for _, p := range list.Items {
				if n.uids[p.Name] == p.UID && p.Status.Phase == corev1.PodRunning {
					running++
				}
			}
			if running == len(n.uids) {
				return nil
			}
		}
		if err := benchkit.Sleep(ctx, 250*time.Millisecond); err != nil {
			return fmt.Errorf("%s: %d of %d pods Running in the cloud after %v", n.e.Name, running, len(n.uids), runBound)
		}
	}
}

// waitOffline waits until the node's tether-edge finds the cloud
// unhealthy (and serves node components from its cache).
func waitOffline(ctx context.Context, n *node) error {
	ctx, cancel := context.WithTimeout(ctx, offlineBound)
	defer cancel()
	for {
		st, err := n.e.Status(ctx)
		if err == nil && st.APIServer != nil && !st.APIServer.Healthy {
			return nil
		}
		if err := benchkit.Sleep(ctx, 100*time.Millisecond); err != nil {
			return fmt.Errorf("tether-edge on %s still finds the cloud healthy %v after the cut", n.e.Name, offlineBound)
		}
	}
}

// offlineRestart kills the node's kubelet and tether-edge (SIGKILL),
// starts both again with the uplink cut, and waits up to bound for every
// pod to run.
func (n *node) offlineRestart(ctx context.Context, bound time.Duration) (runResult, error) {
	if err := n.k.Kill(); err != nil {
		return runResult{}, err
	}
	if err := n.w.Kill(n.e.Host); err != nil {
		note("tether-edge on %s killed: %v", n.e.Name, err)
	}
	n.startEdge()
	start := n.startKubelet(false)
	return n.waitRunning(ctx, start, bound)
}

// procWindow measures tether-edge over a window.
type procWindow struct {
	pid   int
	cpu   time.Duration
	start time.Time
}

func (p *procWindow) begin(ctx context.Context, n *node) error {
	pid, err := n.edgePID(ctx)
	if err != nil {
		return err
	}
	p.pid, p.cpu, p.start = pid, benchkit.CPU(pid), time.Now()
	return nil
}

func (p *procWindow) end() (procSample, error) {
	cpu := benchkit.CPU(p.pid)
	mem, err := benchkit.ReadMem(p.pid)
	if err != nil {
		return procSample{}, fmt.Errorf("tether-edge: %w", err)
	}
	return procSample{mem: mem, cpu: cpu - p.cpu, window: time.Since(p.start)}, nil
}

// parallel calls f for each node at once and returns their errors.
func parallel(nodes []*node, f func(*node) error) error {
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(n)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
