package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// Bounds of a phase's waits.
const (
	readyTimeout   = 90 * time.Second // edges up, the pool converged
	syncTimeout    = 2 * time.Minute  // the informers listed
	receiveTimeout = 3 * time.Minute  // every change seen by every informer
	pollEvery      = 200 * time.Millisecond
)

type bench struct {
	o       options
	s       *testenv.Session
	w       *world.World
	bins    world.Binaries
	uplink  uplink
	perEdge *edgeCounters
	logf    func(string, ...any)
	certs   []*testenv.KeyPair // the simulated followers', by index
}

// phaseResult is one phase of one run.
type phaseResult struct {
	phase string
	run   int
	pool  bool

	change      traffic            // uplink, while the slices changed
	idle        traffic            // uplink, --idle with no change
	perEdge     map[string]traffic // forwarded to/from each node, while the slices changed
	idlePerEdge map[string]traffic // the same, --idle with no change

	writes time.Duration // first update sent → last update returned
	took   time.Duration // first update sent → last change received by the last informer

	leader      string          // from the edges' /status before the changes
	leaderAfter string          // and after
	lag         []time.Duration // pool: a follower's informer receiving a change − the leader's
	toLeader    []time.Duration // pool: update returned → the leader's informer received it
	toAll       []time.Duration // update returned → each informer received it

	mem        map[string]procMem // after the changes
	peaks      []stagePeak        // the largest VmHWM of the edges at each stage
	leaderPID  int
	leaderCPU  time.Duration      // the leader's CPU time while the slices changed (took)
	proxyDown  float64            // bodies the proxies relayed from the cloud, while the slices changed
	replicated float64            // bytes followers received over the pool listener, while the slices changed
	served     map[string]float64 // kube-proxy requests by how they were served, all edges, whole phase
}

func phaseName(pool bool) string {
	if pool {
		return "pool"
	}
	return "no-pool"
}

// phase starts the edges (with or without the pool), a watcher on each,
// and measures one round of changes.
func (b *bench) phase(ctx context.Context, run, round int, pool bool) (phaseResult, error) {
	res := phaseResult{phase: phaseName(pool), run: run, pool: pool}
	edges := b.w.Edges
	b.logf("run %d %s: starting %d tether-edge", run, res.phase, len(edges))
	cmds := make([]*exec.Cmd, len(edges))
	defer b.stopEdges(edges, cmds)
	pids := make([]int, len(edges))
	for i, e := range edges {
		args := []string{
			"--cert", e.CertFile, "--key", e.KeyFile,
			"--server-addr", b.w.CP.URL, "--server-ca", b.w.Path("cluster-ca.crt"),
			"--data-dir", b.w.Path(fmt.Sprintf("poolbench-run%d-%s-%s", run, res.phase, e.Name)),
			"--gateway", fmt.Sprintf("%s:%d", b.w.Gateways[0].Addr, world.TunnelPort), "--gateway-ca", b.w.Path("gateway-ca.crt"),
			"--allow-ports", fmt.Sprint(world.KubeletPort),
			"--log-level", "info",
		}
		if !pool {
			args = append(args, "--pool-listen", "")
		}
		cmds[i] = e.Host.Start(b.s, b.bins.Edge, args...)
		pid, err := benchkit.RealPID(ctx, cmds[i].Process.Pid, b.bins.Edge)
		if err != nil {
			return res, err
		}
		pids[i] = pid
		if pid != cmds[i].Process.Pid {
			b.logf("%s: tether-edge runs as pid %d, a child of the started pid %d", e.Name, pid, cmds[i].Process.Pid)
		}
	}
	if err := b.waitReady(ctx, edges, cmds, pool, &res); err != nil {
		return res, err
	}
	res.peaks = append(res.peaks, peak("ready", pids))

	b.logf("run %d %s: starting %d kube-proxy-like informers", run, res.phase, len(edges))
	ws := make([]*watcher, 0, len(edges))
	defer func() {
		for _, w := range ws {
			w.close()
		}
	}()
	for _, e := range edges {
		w, err := startWatcher(e, b.o.changes)
		if err != nil {
			return res, err
		}
		ws = append(ws, w)
	}
	if err := b.waitSynced(ctx, ws); err != nil {
		return res, err
	}
	res.peaks = append(res.peaks, peak("informers synced", pids))
	if err := benchkit.Sleep(ctx, b.o.settle); err != nil {
		return res, err
	}

	b.logf("run %d %s: %v with no change", run, res.phase, b.o.idle)
	s0, err := b.snapshot(ctx, edges)
	if err != nil {
		return res, err
	}
	if err := benchkit.Sleep(ctx, b.o.idle); err != nil {
		return res, err
	}
	s1, err := b.snapshot(ctx, edges)
	if err != nil {
		return res, err
	}
	res.idle, res.idlePerEdge = s1.uplink.sub(s0.uplink), sub(s1.perEdge, s0.perEdge)

	b.logf("run %d %s: changing %d EndpointSlices", run, res.phase, b.o.changes)
	for _, w := range ws {
		w.expect(round)
	}
	s0, err = b.snapshot(ctx, edges)
	if err != nil {
		return res, err
	}
	li := slices.IndexFunc(edges, func(e *world.Edge) bool { return e.Name == res.leader })
	var cpu0 time.Duration
	if li >= 0 {
		cpu0 = benchkit.CPU(pids[li])
	}
	start := time.Now()
	returned, err := changeAll(ctx, b.w.CP.Client, b.o.changes, round, b.o.workers)
	if err != nil {
		return res, err
	}
	res.writes = slices.MaxFunc(returned, time.Time.Compare).Sub(start)
	rctx, cancel := context.WithTimeout(ctx, receiveTimeout)
	defer cancel()
	got := make([][]time.Time, len(ws))
	var errs []error
	for k, w := range ws {
		got[k], err = w.wait(rctx)
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return res, fmt.Errorf("waiting for the informers: %w", err)
	}
	if li >= 0 {
		res.leaderCPU = benchkit.CPU(pids[li]) - cpu0
	}
	s1, err = b.snapshot(ctx, edges)
	if err != nil {
		return res, err
	}
	res.change, res.perEdge = s1.uplink.sub(s0.uplink), sub(s1.perEdge, s0.perEdge)
	m1 := s1.metrics
	for k := range edges {
		res.proxyDown += m1[k].proxyDown - s0.metrics[k].proxyDown
		res.replicated += m1[k].replicated - s0.metrics[k].replicated
	}
	if pool {
		res.leaderAfter = b.leaderNow(ctx, edges)
	}
	res.peaks = append(res.peaks, peak("after the changes", pids))
	res.mem = map[string]procMem{}
	for k, e := range edges {
		m, err := readMem(pids[k])
		if err != nil {
			return res, fmt.Errorf("memory of tether-edge on %s: %w", e.Name, err)
		}
		m.heap, m.goSys = int64(m1[k].heapInuse), int64(m1[k].goSys)
		res.mem[e.Name] = m
	}
	res.analyse(edges, returned, got, start)
	// The proxy counts a request when it ends: stop the watchers, then
	// read how their watches were served.
	for _, w := range ws {
		w.close()
	}
	ws = nil
	if res.served, err = b.servedTo(ctx, edges); err != nil {
		return res, err
	}
	if pool {
		res.leaderPID = pids[slices.IndexFunc(edges, func(e *world.Edge) bool { return e.Name == res.leader })]
	}
	return res, nil
}

// stagePeak is the largest peak RSS (VmHWM) of the edges by the end of
// a stage of the phase.
type stagePeak struct {
	stage string
	hwm   int64
}

func peak(stage string, pids []int) stagePeak {
	p := stagePeak{stage: stage}
	for _, pid := range pids {
		if m, err := readMem(pid); err == nil {
			p.hwm = max(p.hwm, m.HWM)
		}
	}
	return p
}

// analyse turns the receive times into latencies.
func (res *phaseResult) analyse(edges []*world.Edge, returned []time.Time, got [][]time.Time, start time.Time) {
	li := slices.IndexFunc(edges, func(e *world.Edge) bool { return e.Name == res.leader })
	var last time.Time
	for k := range edges {
		for i, t := range got[k] {
			if t.After(last) {
				last = t
			}
			res.toAll = append(res.toAll, t.Sub(returned[i]))
			switch {
			case li < 0:
			case k == li:
				res.toLeader = append(res.toLeader, t.Sub(returned[i]))
			default:
				res.lag = append(res.lag, t.Sub(got[li][i]))
			}
		}
	}
	res.took = last.Sub(start)
	for _, d := range [][]time.Duration{res.lag, res.toLeader, res.toAll} {
		slices.Sort(d)
	}
}

// waitReady waits until every edge answers /status with a healthy
// apiserver and, with the pool, until one leads, all follow it and all
// replicas are fresh and equal with at least --changes objects.
func (b *bench) waitReady(ctx context.Context, edges []*world.Edge, cmds []*exec.Cmd, pool bool, res *phaseResult) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	var last string
	for {
		for k, e := range edges {
			if e.Host.Exited(cmds[k]) {
				return fmt.Errorf("tether-edge on %s exited:\n%s", e.Name, benchkit.Tail(e.Host.Log(cmds[k]), 2000))
			}
		}
		ok, state := b.ready(ctx, edges, pool, res)
		if ok {
			b.logf("ready: %s", state)
			return nil
		}
		last = state
		if err := benchkit.Sleep(ctx, pollEvery); err != nil {
			return fmt.Errorf("edges not ready within %v: %s", readyTimeout, last)
		}
	}
}

func (b *bench) ready(ctx context.Context, edges []*world.Edge, pool bool, res *phaseResult) (bool, string) {
	var desc []string
	leaders := map[string]bool{}
	digests := map[string]bool{}
	ok := true
	for _, e := range edges {
		st, err := e.Status(ctx)
		switch {
		case err != nil:
			return false, fmt.Sprintf("%s: %v", e.Name, err)
		case st.APIServer == nil || !st.APIServer.Healthy:
			return false, fmt.Sprintf("%s: apiserver not healthy yet", e.Name)
		case !pool:
			continue
		case st.Pool == nil:
			return false, fmt.Sprintf("%s: no pool status", e.Name)
		}
		p := st.Pool
		desc = append(desc, fmt.Sprintf("%s:%s rev %d objects %d fresh %v digest %.8s", e.Name, p.Role, p.Rev, p.Objects, p.Fresh, p.Digest))
		if p.Role == "leader" {
			res.leader = e.Name
		}
		leaders[p.Leader] = true
		digests[p.Digest] = true
		ok = ok && p.Leader != "" && p.Fresh && p.Objects >= b.o.changes
	}
	if pool {
		ok = ok && len(leaders) == 1 && len(digests) == 1 && leaders[res.leader]
	}
	return ok, strings.Join(desc, "; ")
}

// waitSynced waits until every watcher has listed and holds every slice.
func (b *bench) waitSynced(ctx context.Context, ws []*watcher) error {
	ctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	for {
		var pending []string
		for _, w := range ws {
			if ok, n := w.synced(); !ok || n < b.o.changes {
				pending = append(pending, fmt.Sprintf("%s (%d slices)", w.edge.Name, n))
			}
		}
		if len(pending) == 0 {
			return nil
		}
		if err := benchkit.Sleep(ctx, pollEvery); err != nil {
			return fmt.Errorf("informers not synced within %v: %s", syncTimeout, strings.Join(pending, ", "))
		}
	}
}

// snapshot is the counters at one moment: the uplink's, the router's
// per node, and the edges' metrics.
type snapshot struct {
	uplink  traffic
	perEdge map[string]traffic
	metrics []edgeMetrics
}

func (b *bench) snapshot(ctx context.Context, edges []*world.Edge) (snapshot, error) {
	var s snapshot
	var err error
	if s.uplink, err = b.uplink.read(ctx); err != nil {
		return s, err
	}
	if s.perEdge, err = b.perEdge.read(ctx); err != nil {
		return s, err
	}
	s.metrics, err = b.metrics(ctx, edges)
	return s, err
}

// leaderNow is the edge that says it leads, or "".
func (b *bench) leaderNow(ctx context.Context, edges []*world.Edge) string {
	for _, e := range edges {
		if st, err := e.Status(ctx); err == nil && st.Pool != nil && st.Pool.Role == "leader" {
			return e.Name
		}
	}
	return ""
}

// servedTo waits up to 5 s until every edge has counted a request of
// kube-proxy (the watchers' watches, once they ended) and returns them
// by how they were served, summed over the edges.
func (b *bench) servedTo(ctx context.Context, edges []*world.Edge) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		ms, err := b.metrics(ctx, edges)
		if err != nil {
			return nil, err
		}
		sum, all := map[string]float64{}, true
		for _, m := range ms {
			n := 0.0
			for s, v := range m.served {
				sum[s] += v
				n += v
			}
			all = all && n > 0
		}
		if all || benchkit.Sleep(ctx, pollEvery) != nil {
			return sum, nil
		}
	}
}

func (b *bench) metrics(ctx context.Context, edges []*world.Edge) ([]edgeMetrics, error) {
	out := make([]edgeMetrics, len(edges))
	for k, e := range edges {
		m, err := readMetrics(ctx, e)
		if err != nil {
			return nil, err
		}
		out[k] = m
	}
	return out, nil
}

// stopEdges stops the edges' processes, all at once.
func (b *bench) stopEdges(edges []*world.Edge, cmds []*exec.Cmd) {
	var wg sync.WaitGroup
	for k, cmd := range cmds {
		if cmd == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var exit *exec.ExitError
			if err := edges[k].Host.Stop(cmd); err != nil && !(errors.As(err, &exit) && exit.ExitCode() == -1) {
				b.logf("stop tether-edge on %s: %v", edges[k].Name, err)
			}
		}()
	}
	wg.Wait()
}
