package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore"
	"github.com/tether-edge/tether/poolstore/feed"
)

// membersResult is the members phase of one run: a pool of --members
// nodes, one tether-edge (the leader) and the others simulated followers.
type membersResult struct {
	run       int
	members   int // the pool's size: the leader and its followers
	leader    string
	leaderPID int

	// The leader alone (its own informer, no follower) while the slices
	// changed once: its CPU time and how long that round took, the base
	// that the followers' cost is over.
	aloneCPU, aloneTook time.Duration

	// The followers' first sync: from starting them to every replica
	// holding the leader's store (a snapshot each).
	firstSync    time.Duration
	firstSyncCPU time.Duration // the leader's CPU time meanwhile
	firstSyncOwn time.Duration // and this process's (the followers)
	syncHWM      int64         // the leader's VmHWM after it

	// --idle with no change.
	idle      time.Duration
	idleCPU   time.Duration
	idleBytes []traffic // per follower, on its connection

	// While the slices changed: the first update sent to the last change
	// in the last replica.
	writes, took time.Duration
	changeCPU    time.Duration
	selfCPU      time.Duration // this process's: the followers, the writers, the informer
	lag          []time.Duration
	toLeader     []time.Duration // update returned → the leader's informer received it
	toFollowers  []time.Duration // update returned → in a follower's replica
	bytes        []traffic       // per follower, on its connection
	frames       []float64       // per follower, replication frames' bytes
	leaderDisk   int64           // bytes the leader wrote to storage
	followerDisk int64           // bytes all followers wrote to storage (this process)

	// The leader's memory and goroutines before the followers connected,
	// and after the changes.
	memBefore, memAfter procMem
	before, after       edgeMetrics
	streams             float64            // replication streams the leader served at the end
	ended               map[string]float64 // streams the leader ended, by reason, during the phase
	epochBefore         string             // the leader's term before the followers
	epochAfter          string             // and after the changes
	resyncs             uint64             // snapshots the followers loaded, all together
	digests             string             // replicas equal to the leader's at the end
}

// lanPerFollower is the mean bytes (both directions) on a follower's
// connection while the slices changed.
func (r membersResult) lanPerFollower() float64 { return meanTraffic(r.bytes) }

func meanTraffic(ts []traffic) float64 {
	if len(ts) == 0 {
		return 0
	}
	var sum int64
	for _, t := range ts {
		sum += t.down + t.up
	}
	return float64(sum) / float64(len(ts))
}

func (r membersResult) changeCPUPct() float64 { return pctOf(r.changeCPU, r.took) }

// perFollowerCPU is the leader's CPU time per change and follower: its
// CPU time while the slices changed with the followers minus that with
// none, over changes and followers.
func (r membersResult) perFollowerCPU(changes int) time.Duration {
	if len(r.bytes) == 0 || changes == 0 {
		return 0
	}
	return (r.changeCPU - r.aloneCPU) / time.Duration(changes*len(r.bytes))
}

func pctOf(cpu, wall time.Duration) float64 {
	if wall <= 0 {
		return 0
	}
	return 100 * cpu.Seconds() / wall.Seconds()
}

// ensureSimNodes creates the Nodes of the simulated followers (pool
// label, edge label; no address: nobody dials a follower) unless they
// exist. The leader learns its pool's members from the Nodes.
func (b *bench) ensureSimNodes(ctx context.Context, n int) error {
	nodes := b.w.CP.Client.CoreV1().Nodes()
	return benchkit.Parallel(ctx, 8, n, func(i int) error {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: simName(i + 1),
			Labels: map[string]string{world.EdgeLabel: "true", world.PoolLabel: siteName, corev1.LabelHostname: simName(i + 1)}}}
		if _, err := nodes.Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create node %s: %w", node.Name, err)
		}
		return nil
	})
}

// simCerts issues the simulated followers' node certificates, once.
func (b *bench) simCerts(n int) ([]*testenv.KeyPair, error) {
	for k := len(b.certs) + 1; k <= n; k++ {
		kp, err := b.w.ClusterCA.NodeCert(simName(k))
		if err != nil {
			return nil, err
		}
		b.certs = append(b.certs, kp)
	}
	return b.certs[:n], nil
}

// membersPhase runs one tether-edge, which leads the pool, and measures
// a round of changes (alone) with only its own informer; then it starts
// --members − 1 simulated followers and measures their first sync, an
// idle window and another round of changes (round).
func (b *bench) membersPhase(ctx context.Context, run, alone, round int) (membersResult, error) {
	res := membersResult{run: run, members: b.o.members}
	leader, src := b.w.Edges[0], b.w.Edges[1]
	nf := b.o.members - 1
	note("run %d members: %d simulated followers (nodes and certificates)", run, nf)
	if err := b.ensureSimNodes(ctx, nf); err != nil {
		return res, err
	}
	certs, err := b.simCerts(nf)
	if err != nil {
		return res, err
	}

	// The leader: the only tether-edge, so the only candidate.
	args := []string{
		"--cert", leader.CertFile, "--key", leader.KeyFile,
		"--server-addr", b.w.CP.URL, "--server-ca", b.w.Path("cluster-ca.crt"),
		"--data-dir", b.w.Path(fmt.Sprintf("poolbench-run%d-members-%s", run, leader.Name)),
		"--gateway", fmt.Sprintf("%s:%d", b.w.Gateways[0].Addr, world.TunnelPort), "--gateway-ca", b.w.Path("gateway-ca.crt"),
		"--allow-ports", fmt.Sprint(world.KubeletPort),
		"--log-level", "info",
	}
	if b.o.cpuProfile != "" {
		args = append(args, "--profiling")
	}
	cmds := []*exec.Cmd{leader.Host.Start(b.s, b.bins.Edge, args...)}
	defer b.stopEdges([]*world.Edge{leader}, cmds)
	pid, err := benchkit.RealPID(ctx, cmds[0].Process.Pid, b.bins.Edge)
	if err != nil {
		return res, err
	}
	res.leaderPID = pid
	var pr phaseResult
	if err := b.waitReady(ctx, []*world.Edge{leader}, cmds, true, &pr); err != nil {
		return res, err
	}
	if res.leader = pr.leader; res.leader != leader.Name {
		return res, fmt.Errorf("%s does not lead its pool (%q does)", leader.Name, res.leader)
	}
	st, err := leader.Status(ctx)
	if err != nil {
		return res, err
	}
	res.epochBefore = st.Pool.Epoch

	// The leader node's own kube-proxy, as in the pool phase.
	w, err := startWatcher(leader, b.o.changes)
	if err != nil {
		return res, err
	}
	defer w.close()
	if err := b.waitSynced(ctx, []*watcher{w}); err != nil {
		return res, err
	}
	b.logf("run %d members: changing %d EndpointSlices, the leader alone", run, b.o.changes)
	w.expect(alone)
	cpu0, start := benchkit.CPU(pid), time.Now()
	if _, err := changeAll(ctx, b.w.CP.Client, b.o.changes, alone, b.o.workers); err != nil {
		return res, err
	}
	actx, cancel := context.WithTimeout(ctx, receiveTimeout)
	defer cancel()
	if _, err := w.wait(actx); err != nil {
		return res, fmt.Errorf("the leader alone: %w", err)
	}
	res.aloneCPU, res.aloneTook = benchkit.CPU(pid)-cpu0, time.Since(start)
	if st, err = leader.Status(ctx); err != nil {
		return res, err
	}
	if res.before, err = readMetrics(ctx, leader); err != nil {
		return res, err
	}
	if res.memBefore, err = readMem(pid); err != nil {
		return res, err
	}

	// The followers.
	b.logf("run %d members: starting %d followers", run, nf)
	dir := b.w.Path(fmt.Sprintf("poolbench-run%d-members", run))
	leaderAddr := fmt.Sprintf("%s:%d", leader.Host.Addr, poolstore.DefaultPort)
	log := slog.New(slog.DiscardHandler)
	if b.o.verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	fctx, fcancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		fcancel()
		wg.Wait()
	}()
	cpu0, own0 := benchkit.CPU(pid), benchkit.CPU(os.Getpid())
	start = time.Now()
	sims := make([]*simFollower, 0, nf)
	for k := range nf {
		sf, err := newSimFollower(simName(k+1), dir, certs[k].TLS, b.w.ClusterCA, b.gatewayVerifier, src.Host, leader.Name, leaderAddr, b.o.changes, log)
		if err != nil {
			return res, err
		}
		sims = append(sims, sf)
		wg.Go(func() {
			if err := sf.run(fctx); err != nil && fctx.Err() == nil {
				note("follower %s: %v", sf.name, err)
			}
		})
	}
	if err := waitReplicas(ctx, sims, st.Pool.Epoch, st.Pool.Rev, b.o.changes); err != nil {
		return res, err
	}
	res.firstSync = time.Since(start)
	cpu1 := benchkit.CPU(pid)
	res.firstSyncCPU, res.firstSyncOwn = cpu1-cpu0, benchkit.CPU(os.Getpid())-own0
	if m, err := readMem(pid); err == nil {
		res.syncHWM = m.HWM
	}
	note("run %d members: %d followers synced in %v", run, nf, res.firstSync.Round(10*time.Millisecond))

	if err := benchkit.Sleep(ctx, b.o.settle); err != nil {
		return res, err
	}

	b.logf("run %d members: %v with no change", run, b.o.idle)
	b0, cpu0 := fwdBytes(sims), benchkit.CPU(pid)
	t0 := time.Now()
	if err := benchkit.Sleep(ctx, b.o.idle); err != nil {
		return res, err
	}
	res.idle, res.idleCPU = time.Since(t0), benchkit.CPU(pid)-cpu0
	res.idleBytes = subAll(fwdBytes(sims), b0)

	b.logf("run %d members: changing %d EndpointSlices", run, b.o.changes)
	w.expect(round)
	for _, sf := range sims {
		sf.track.expect(round)
	}
	b0, f0 := fwdBytes(sims), frameBytes(sims)
	cpu0, self0 := benchkit.CPU(pid), benchkit.CPU(os.Getpid())
	disk0, fdisk0 := benchkit.Written(pid), benchkit.Written(os.Getpid())
	start = time.Now()
	var profErr chan error
	if b.o.cpuProfile != "" {
		profErr = make(chan error, 1)
		secs := 5 + b.o.changes/(20*b.o.workers)
		go func() { profErr <- cpuProfile(ctx, leader, secs, b.o.cpuProfile) }()
		stop, err := selfProfile(b.o.cpuProfile + ".followers")
		if err != nil {
			return res, err
		}
		defer stop()
	}
	returned, err := changeAll(ctx, b.w.CP.Client, b.o.changes, round, b.o.workers)
	if err != nil {
		return res, err
	}
	res.writes = slices.MaxFunc(returned, time.Time.Compare).Sub(start)
	rctx, cancel := context.WithTimeout(ctx, receiveTimeout)
	defer cancel()
	ldr, err := w.wait(rctx)
	errs := []error{err}
	got := make([][]time.Time, len(sims))
	for k, sf := range sims {
		got[k], err = sf.track.wait(rctx, sf.name)
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return res, fmt.Errorf("waiting for the replicas: %w", err)
	}
	res.changeCPU, res.selfCPU = benchkit.CPU(pid)-cpu0, benchkit.CPU(os.Getpid())-self0
	res.leaderDisk, res.followerDisk = benchkit.Written(pid)-disk0, benchkit.Written(os.Getpid())-fdisk0
	res.bytes = subAll(fwdBytes(sims), b0)
	f1 := frameBytes(sims)
	for k := range f1 {
		res.frames = append(res.frames, f1[k]-f0[k])
	}
	res.analyse(returned, ldr, got, start)
	if res.after, err = readMetrics(ctx, leader); err != nil {
		return res, err
	}
	res.streams = res.after.streams
	res.ended = map[string]float64{}
	for reason, v := range res.after.ended {
		if d := v - res.before.ended[reason]; d > 0 {
			res.ended[reason] = d
		}
	}
	if st, err := leader.Status(ctx); err == nil && st.Pool != nil {
		res.epochAfter = st.Pool.Epoch
	}
	if res.memAfter, err = readMem(pid); err != nil {
		return res, err
	}
	for _, sf := range sims {
		res.resyncs += sf.f.Status().Resyncs
	}
	res.digests = compareReplicas(ctx, leader, sims)
	if profErr != nil {
		if err := <-profErr; err != nil {
			note("CPU profile of the leader: %v", err)
		} else {
			note("CPU profile of the leader during the changes: %s (go tool pprof %s %s)", b.o.cpuProfile, b.bins.Edge, b.o.cpuProfile)
		}
	}
	return res, nil
}

// waitReplicas waits until every follower's replica is of epoch, at rev
// or later and holds at least n objects.
func waitReplicas(ctx context.Context, sims []*simFollower, epoch string, rev uint64, n int) error {
	ctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	for {
		var pending []string
		for _, sf := range sims {
			if sf.store.Epoch() != epoch || sf.store.Rev() < rev || sf.store.Len() < n {
				pending = append(pending, sf.name)
			}
		}
		if len(pending) == 0 {
			return nil
		}
		if err := benchkit.Sleep(ctx, pollEvery); err != nil {
			st := sims[slices.IndexFunc(sims, func(sf *simFollower) bool { return sf.name == pending[0] })].f.Status()
			return fmt.Errorf("%d followers not synced within %v (%s...; %s: rev %d, last error %q)",
				len(pending), syncTimeout, strings.Join(pending[:min(5, len(pending))], ", "), pending[0], st.Rev, st.LastError)
		}
	}
}

// compareReplicas says how many followers' replicas equal the leader's
// (same revision and digest) within 10 s.
func compareReplicas(ctx context.Context, leader *world.Edge, sims []*simFollower) string {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		st, err := leader.Status(ctx)
		if err != nil || st.Pool == nil {
			return fmt.Sprintf("unknown (%v)", err)
		}
		equal := 0
		for _, sf := range sims {
			if sf.store.Rev() == st.Pool.Rev && sf.store.Digest() == st.Pool.Digest {
				equal++
			}
		}
		if equal == len(sims) || benchkit.Sleep(ctx, pollEvery) != nil {
			return fmt.Sprintf("%d of %d", equal, len(sims))
		}
	}
}

// analyse turns the arrival times into latencies: lag is a follower's
// replica holding a change minus the leader's informer receiving it.
func (res *membersResult) analyse(returned, ldr []time.Time, got [][]time.Time, start time.Time) {
	last := slices.MaxFunc(ldr, time.Time.Compare)
	for i, t := range ldr {
		res.toLeader = append(res.toLeader, t.Sub(returned[i]))
	}
	for _, g := range got {
		for i, t := range g {
			last = later(last, t)
			res.lag = append(res.lag, t.Sub(ldr[i]))
			res.toFollowers = append(res.toFollowers, t.Sub(returned[i]))
		}
	}
	res.took = last.Sub(start)
	for _, d := range [][]time.Duration{res.lag, res.toLeader, res.toFollowers} {
		slices.Sort(d)
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func fwdBytes(sims []*simFollower) []traffic {
	out := make([]traffic, len(sims))
	for k, sf := range sims {
		out[k] = sf.fwd.bytes()
	}
	return out
}

func frameBytes(sims []*simFollower) []float64 {
	out := make([]float64, len(sims))
	for k, sf := range sims {
		out[k] = sf.receivedBytes()
	}
	return out
}

func subAll(after, before []traffic) []traffic {
	out := make([]traffic, len(after))
	for k := range after {
		out[k] = after[k].sub(before[k])
	}
	return out
}

// selfProfile starts a CPU profile of this process (the simulated
// followers, the writers and the informers) into path; stop ends it.
func selfProfile(path string) (stop func(), _ error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	note("CPU profile of this process (the followers) during the changes: %s", path)
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// cpuProfile saves a CPU profile of e's tether-edge (started with
// --profiling) over secs seconds to path.
func cpuProfile(ctx context.Context, e *world.Edge, secs int, path string) error {
	return benchkit.SaveURL(ctx, e.Host.DialContext, world.EdgeAdmin(fmt.Sprintf("/debug/pprof/profile?seconds=%d", secs)), path, time.Duration(secs+30)*time.Second)
}

// gatewayVerifier is a simulated follower's check of what the gateways
// sign, as tether-edge builds it from --gateway-ca and the --gateway
// hosts.
func (b *bench) gatewayVerifier() (*feed.Verifier, error) {
	var names []string
	for _, gw := range b.w.Gateways {
		names = append(names, gw.Addr.String())
	}
	return feed.NewVerifier(feed.VerifierOptions{Roots: b.w.GatewayCA.Pool, Names: names})
}
