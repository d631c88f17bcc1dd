package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/e2e/world"
)

// Targets of the issue.
const (
	targetRatio = 1.2 / 10
	targetLag   = 100 * time.Millisecond
	targetRSS   = 64 << 20
)

func printHeader(o options, outDir string) {
	var eff []string
	flag.VisitAll(func(f *flag.Flag) {
		eff = append(eff, fmt.Sprintf("--%s=%s", f.Name, f.Value))
	})
	fmt.Printf("poolbench: Tether node pool, %d edges, %d EndpointSlices changed once per phase; phases %s", o.edges, o.changes, strings.Join(o.phases, ", "))
	if o.has(phaseMembers) {
		fmt.Printf(" (members: a pool of %d)", o.members)
	}
	fmt.Println()
	fmt.Printf("command:  %s\n", strings.Join(append([]string{filepath.Base(os.Args[0])}, os.Args[1:]...), " "))
	fmt.Printf("settings: %s\n", strings.Join(eff, " "))
	fmt.Printf("machine:  %d CPUs (nproc), load average %s at start, %s\n", runtime.NumCPU(), world.LoadAvg(), runtime.Version())
	fmt.Printf("date:     %s\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Printf("output:   %s (this text and the plots)\n\n", outDir)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }

func kB(n float64) string { return fmt.Sprintf("%.1f", n/1e3) }

func mB(n int64) string { return fmt.Sprintf("%.1f", float64(n)/(1<<20)) }

// ratio is the pool phase's bytes down over the no-pool phase's of the
// same run, or -1.
func ratio(res []phaseResult, r phaseResult) float64 {
	for _, o := range res {
		if o.run == r.run && !o.pool && o.change.down > 0 {
			return float64(r.change.down) / float64(o.change.down)
		}
	}
	return -1
}

func (r phaseResult) memStats() (maxRSS, meanRSS, maxHWM int64) {
	for _, m := range r.mem {
		maxRSS = max(maxRSS, m.RSS)
		maxHWM = max(maxHWM, m.HWM)
		meanRSS += m.RSS
	}
	if len(r.mem) > 0 {
		meanRSS /= int64(len(r.mem))
	}
	return
}

func printTable(o options, res []phaseResult) {
	fmt.Printf("Uplink of site %s (wan0 of its router, link-layer bytes; down = cloud → site), while %d EndpointSlices changed once:\n\n", siteName, o.changes)
	fmt.Printf("%-8s %3s %12s %10s %7s %10s %10s %10s %10s %9s %9s %9s %9s\n",
		"phase", "run", "down kB", "up kB", "ratio", "lag p50", "lag p99", "RSS max", "RSS mean", "writes s", "took s", "idle dn", "idle up")
	fmt.Printf("%-8s %3s %12s %10s %7s %10s %10s %10s %10s %9s %9s %9s %9s\n",
		"", "", "", "", "", "ms", "ms", "MiB", "MiB", "", "", "kB", "kB")
	for _, r := range res {
		rt, lag50, lag99 := "-", "-", "-"
		if r.pool {
			if v := ratio(res, r); v >= 0 {
				rt = fmt.Sprintf("%.3f", v)
			}
			lag50, lag99 = ms(benchkit.Pct(r.lag, 50)), ms(benchkit.Pct(r.lag, 99))
		}
		maxRSS, meanRSS, _ := r.memStats()
		fmt.Printf("%-8s %3d %12s %10s %7s %10s %10s %10s %10s %9.1f %9.1f %9s %9s\n",
			r.phase, r.run, kB(float64(r.change.down)), kB(float64(r.change.up)), rt, lag50, lag99,
			mB(maxRSS), mB(meanRSS), r.writes.Seconds(), r.took.Seconds(), kB(float64(r.idle.down)), kB(float64(r.idle.up)))
	}
	fmt.Printf("\nratio: the pool's bytes down over the no-pool phase's of the same run. lag: a follower's informer receiving a\n" +
		"change minus the leader's informer receiving it. writes: the first update sent to the last returned (the admin\n" +
		"client allows 100 requests/s); took: to the last change received by the last informer. idle: the uplink over --idle\n" +
		"with no change (health checks every 2 s per node, election renewals). RSS: VmRSS of each tether-edge after the changes.\n")

	fmt.Printf("\nDetails:\n\n")
	fmt.Printf("%-8s %3s %9s %9s %9s %9s %9s %9s %9s %12s %12s %10s\n",
		"phase", "run", "lag max", "upd→ldr", "upd→ldr", "upd→all", "upd→all", "upd→all", "HWM max", "proxy down", "LAN repl.", "kube-proxy")
	fmt.Printf("%-8s %3s %9s %9s %9s %9s %9s %9s %9s %12s %12s %10s\n",
		"", "", "ms", "p50 ms", "p99 ms", "p50 ms", "p99 ms", "max ms", "MiB", "kB", "kB", "served")
	for _, r := range res {
		lagMax, l50, l99 := "-", "-", "-"
		if r.pool {
			lagMax = ms(benchkit.Pct(r.lag, 100))
			l50, l99 = ms(benchkit.Pct(r.toLeader, 50)), ms(benchkit.Pct(r.toLeader, 99))
		}
		_, _, hwm := r.memStats()
		fmt.Printf("%-8s %3d %9s %9s %9s %9s %9s %9s %9s %12s %12s %10s\n",
			r.phase, r.run, lagMax, l50, l99, ms(benchkit.Pct(r.toAll, 50)), ms(benchkit.Pct(r.toAll, 99)), ms(benchkit.Pct(r.toAll, 100)),
			mB(hwm), kB(r.proxyDown), kB(r.replicated), served(r.served))
	}
	fmt.Printf("\nupd→ldr: the update call returning in this process to the leader's informer receiving the change; upd→all: to\n" +
		"every informer. HWM: VmHWM, the peak RSS. proxy down: response bodies the nodes' apiserver proxies relayed from\n" +
		"the cloud (tether_edge_apiserver_bytes_total, all nodes; the pool leader's watches go through its proxy too).\n" +
		"LAN repl.: bytes the followers received from the leader (tether_edge_pool_bytes_received_total). kube-proxy served:\n" +
		"the watchers' requests by how the proxies served them, whole phase (pool = from the replica).\n")
}

func served(m map[string]float64) string {
	var parts []string
	for _, k := range []string{"pool", "upstream"} {
		if v := m[k]; v > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, v))
		}
	}
	for k, v := range m {
		if k != "pool" && k != "upstream" && v > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f", k, v))
		}
	}
	return strings.Join(parts, ", ")
}

func printTargets(res []phaseResult) {
	var ratios []float64
	var lag []time.Duration
	var with, without []int64
	var peak, rss int64
	peakAt := ""
	for _, r := range res {
		if r.pool {
			if v := ratio(res, r); v >= 0 {
				ratios = append(ratios, v)
			}
			lag = append(lag, r.lag...)
			with = append(with, r.change.down)
		} else {
			without = append(without, r.change.down)
		}
		for name, m := range r.mem {
			if m.HWM > peak {
				peak, peakAt = m.HWM, fmt.Sprintf("%s, %s run %d", name, r.phase, r.run)
			}
			rss = max(rss, m.RSS)
		}
	}
	slices.Sort(lag)
	met := func(ok bool) string {
		if ok {
			return "met   "
		}
		return "MISSED"
	}
	fmt.Printf("\nTargets:\n")
	if len(ratios) > 0 {
		v := medianF(ratios)
		fmt.Printf("  %s bytes down with the pool at most %.2f of without: %.3f (median of %d runs; %s kB with, %s kB without)\n",
			met(v <= targetRatio), targetRatio, v, len(ratios), kB(medianI(with)), kB(medianI(without)))
	}
	if len(lag) > 0 {
		p99 := benchkit.Pct(lag, 99)
		fmt.Printf("  %s replication lag p99 at most %v: p99 %s ms, p50 %s ms, max %s ms (%d follower receipts)\n",
			met(p99 <= targetLag), targetLag, ms(p99), ms(benchkit.Pct(lag, 50)), ms(benchkit.Pct(lag, 100)), len(lag))
	}
	fmt.Printf("  %s RSS at most %d MiB per node: peak (VmHWM) %s MiB (%s); largest VmRSS after the changes %s MiB\n",
		met(peak <= targetRSS), targetRSS>>20, mB(peak), peakAt, mB(rss))
}

// printNotes prints, per phase, which nodes' traffic the uplink carried
// and the leader's memory next to the followers'.
func printNotes(res []phaseResult) {
	fmt.Printf("\nUplink bytes by node (IP bytes the site router forwarded to each node), while the slices changed | with no change:\n")
	for _, r := range res {
		fmt.Printf("  %-8s run %d: %s | %s\n", r.phase, r.run, byNode(r, r.perEdge), byNode(r, r.idlePerEdge))
		var anon, file, heap, goSys []int64
		for _, m := range r.mem {
			anon, file = append(anon, m.Anon), append(file, m.File)
			heap, goSys = append(heap, m.heap), append(goSys, m.goSys)
		}
		fmt.Printf("  %-8s run %d: RSS median: anonymous %s MiB, files %s MiB; Go heap in use %s MiB, Go runtime total %s MiB\n", "", r.run,
			mB(int64(medianI(anon))), mB(int64(medianI(file))), mB(int64(medianI(heap))), mB(int64(medianI(goSys))))
		var peaks []string
		for _, p := range r.peaks {
			peaks = append(peaks, fmt.Sprintf("%s %s", p.stage, mB(p.hwm)))
		}
		fmt.Printf("  %-8s run %d: largest peak RSS (VmHWM) so far, by stage: %s MiB\n", "", r.run, strings.Join(peaks, ", "))
		if !r.pool {
			continue
		}
		var f []int64
		for name, m := range r.mem {
			if name != r.leader {
				f = append(f, m.RSS)
			}
		}
		lm := r.mem[r.leader]
		fmt.Printf("  %-8s run %d: RSS leader %s MiB (anonymous %s, files %s, Go heap in use %s; peak %s; pid %d), followers median %s MiB\n", "", r.run,
			mB(lm.RSS), mB(lm.Anon), mB(lm.File), mB(lm.heap), mB(lm.HWM), r.leaderPID, mB(int64(medianI(f))))
		fmt.Printf("  %-8s run %d: CPU of the leader while the slices changed: %.2f s over %.1f s, %.1f %% of one core\n", "", r.run,
			r.leaderCPU.Seconds(), r.took.Seconds(), pctOf(r.leaderCPU, r.took))
		if r.leaderAfter != r.leader {
			fmt.Printf("  %-8s run %d: note: the leader changed from %s to %q during the phase\n", "", r.run, r.leader, r.leaderAfter)
		}
		if r.served["upstream"] > 0 {
			fmt.Printf("  %-8s run %d: note: %.0f kube-proxy requests went to the cloud, not the replica\n", "", r.run, r.served["upstream"])
		}
	}
}

// byNode sums up bytes down by node: the leader's and the others'.
func byNode(r phaseResult, t map[string]traffic) string {
	var others []int64
	var out string
	for name, v := range t {
		if r.pool && name == r.leader {
			out = fmt.Sprintf("leader %s down %s up %s kB; ", name, kB(float64(v.down)), kB(float64(v.up)))
			continue
		}
		others = append(others, v.down)
	}
	if len(others) == 0 {
		return out
	}
	slices.Sort(others)
	var sum int64
	for _, v := range others {
		sum += v
	}
	what := "each node"
	if r.pool {
		what = "each follower"
	}
	return out + fmt.Sprintf("%s down min %s mean %s max %s kB", what, kB(float64(others[0])), kB(float64(sum)/float64(len(others))), kB(float64(others[len(others)-1])))
}

func medianF(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func medianI(v []int64) float64 {
	f := make([]float64, len(v))
	for i, x := range v {
		f[i] = float64(x)
	}
	if len(f) == 0 {
		return 0
	}
	return medianF(f)
}

// printMembers prints the members phases: the pool at size.
func printMembers(o options, res []membersResult) {
	nf := o.members - 1
	fmt.Printf("\nPool of %d members (one tether-edge, the leader; %d simulated followers), while %d EndpointSlices changed once:\n\n", o.members, nf, o.changes)
	fmt.Printf("%3s %8s %8s %8s %9s %7s %8s %8s %8s %8s %10s %10s %10s %8s\n",
		"run", "lag p50", "lag p99", "lag max", "upd→flw", "took", "ldr CPU", "ldr idle", "ldr RSS", "ldr HWM", "LAN/flw", "frames/flw", "idle/flw", "1st sync")
	fmt.Printf("%3s %8s %8s %8s %9s %7s %8s %8s %8s %8s %10s %10s %10s %8s\n",
		"", "ms", "ms", "ms", "p99 ms", "s", "%", "CPU %", "MiB", "MiB", "kB", "kB", "B/s", "s")
	for _, r := range res {
		fmt.Printf("%3d %8s %8s %8s %9s %7.1f %8.1f %8.1f %8s %8s %10s %10s %10.0f %8.1f\n",
			r.run, ms(benchkit.Pct(r.lag, 50)), ms(benchkit.Pct(r.lag, 99)), ms(benchkit.Pct(r.lag, 100)), ms(benchkit.Pct(r.toFollowers, 99)), r.took.Seconds(),
			r.changeCPUPct(), pctOf(r.idleCPU, r.idle), mB(r.memAfter.RSS), mB(r.memAfter.HWM),
			kB(r.lanPerFollower()), kB(meanF(r.frames)), meanTraffic(r.idleBytes)/r.idle.Seconds(), r.firstSync.Seconds())
	}
	fmt.Printf("\nlag: a follower's replica holding a change minus the leader node's kube-proxy-like informer receiving it (both\n" +
		"read by this process; negative when the replica is first). upd→flw: the update returning to the change in a\n" +
		"follower's replica. took: the first update sent to the last change in the last replica. ldr CPU: the leader's\n" +
		"CPU time over took, in percent of one core; idle: over --idle with no change. ldr RSS: VmRSS after the changes; HWM:\n" +
		"its peak. LAN/flw: bytes on a follower's connection while the slices changed, both directions (TLS records,\n" +
		"without TCP/IP headers), mean of the followers; frames/flw: the replication frames in it; idle/flw: bytes per\n" +
		"second on a follower's connection with no change (sync frames, HTTP/2 pings). 1st sync: starting the followers\n" +
		"to every replica holding the leader's store (a snapshot each).\n")

	fmt.Printf("\nDetails:\n")
	for _, r := range res {
		n := float64(max(len(r.bytes), 1))
		changes := float64(o.changes)
		fmt.Printf("  run %d: leader %s (pid %d): CPU %.2f s over %.1f s of changes; first sync of %d followers %.1f s with %.2f s of CPU (this process: %.2f s), peak RSS %s MiB then\n",
			r.run, r.leader, r.leaderPID, r.changeCPU.Seconds(), r.took.Seconds(), len(r.bytes), r.firstSync.Seconds(), r.firstSyncCPU.Seconds(),
			r.firstSyncOwn.Seconds(), mB(r.syncHWM))
		fmt.Printf("  run %d: leader before the followers → after the changes: RSS %s → %s MiB (anonymous %s → %s), Go heap in use %s → %s MiB, goroutines %.0f → %.0f; %.0f streams served\n",
			r.run, mB(r.memBefore.RSS), mB(r.memAfter.RSS), mB(r.memBefore.Anon), mB(r.memAfter.Anon),
			mB(int64(r.before.heapInuse)), mB(int64(r.after.heapInuse)), r.before.goroutines, r.after.goroutines, r.streams)
		fmt.Printf("  run %d: the leader alone (its own informer, no follower): CPU %.2f s over %.1f s of the same changes (%.1f %% of one core)\n",
			r.run, r.aloneCPU.Seconds(), r.aloneTook.Seconds(), pctOf(r.aloneCPU, r.aloneTook))
		fmt.Printf("  run %d: per follower on the leader: RSS %.0f KiB, Go heap %.0f KiB, %.1f goroutines; CPU %.1f µs per change per follower (CPU with followers minus alone)\n",
			r.run, float64(r.memAfter.RSS-r.memBefore.RSS)/n/1024, (r.after.heapInuse-r.before.heapInuse)/n/1024,
			(r.after.goroutines-r.before.goroutines)/n, float64(r.perFollowerCPU(o.changes))/1e3)
		var down []int64
		var up int64
		for _, t := range r.bytes {
			down = append(down, t.down)
			up += t.up
		}
		slices.Sort(down)
		if len(down) > 0 {
			fmt.Printf("  run %d: per follower while changing: down min %s mean %s max %s kB, up mean %s kB; %.0f B per change on the LAN, %.0f B of frames\n",
				r.run, kB(float64(down[0])), kB(medianI(down)), kB(float64(down[len(down)-1])), kB(float64(up)/n),
				r.lanPerFollower()/changes, meanF(r.frames)/changes)
		}
		fmt.Printf("  run %d: written to storage while changing: leader %s kB (%.0f B per change); followers %s kB each (%.0f B per change, %.1f× the frames' bytes)\n",
			r.run, kB(float64(r.leaderDisk)), float64(r.leaderDisk)/changes, kB(float64(r.followerDisk)/n),
			float64(r.followerDisk)/n/changes, float64(r.followerDisk)/n/max(meanF(r.frames), 1))
		fmt.Printf("  run %d: this process (followers, writers, informers) used %.2f s of CPU while changing, %.0f µs per change per follower\n",
			r.run, r.selfCPU.Seconds(), r.selfCPU.Seconds()*1e6/changes/n)
		fmt.Printf("  run %d: replicas equal to the leader's at the end: %s; snapshots loaded by the followers: %d (one each at first sync)\n",
			r.run, r.digests, r.resyncs)
		if len(r.ended) > 0 {
			var parts []string
			for reason, v := range r.ended {
				parts = append(parts, fmt.Sprintf("%s %.0f", reason, v))
			}
			slices.Sort(parts)
			fmt.Printf("  run %d: note: replication streams the leader ended meanwhile: %s\n", r.run, strings.Join(parts, ", "))
		}
		if r.epochAfter != r.epochBefore {
			fmt.Printf("  run %d: note: the leader's term changed during the phase (%s → %q): every follower resynced from a snapshot\n",
				r.run, r.epochBefore, r.epochAfter)
		}
	}
	var lag []time.Duration
	for _, r := range res {
		lag = append(lag, r.lag...)
	}
	slices.Sort(lag)
	met := "MISSED"
	if benchkit.Pct(lag, 99) <= targetLag {
		met = "met   "
	}
	fmt.Printf("\nTarget, %d members:\n  %s replication lag p99 at most %v: p99 %s ms, p50 %s ms, max %s ms (%d follower receipts)\n",
		o.members, met, targetLag, ms(benchkit.Pct(lag, 99)), ms(benchkit.Pct(lag, 50)), ms(benchkit.Pct(lag, 100)), len(lag))
	fmt.Printf("  (figures from this machine are indicative: the leader, %d followers, the writers and the control plane share its %d CPUs)\n",
		nf, runtime.NumCPU())
}

func meanF(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	var s float64
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// printSummary prints the machine-readable last line, from the members
// phases (all runs: lag p99 of all receipts, the largest CPU and RSS,
// the mean bytes), or else from the pool phases. lan_bytes_per_follower:
// in the members phase, the bytes on a follower's connection while the
// slices changed (TLS records both ways); in the pool phase, the
// replication frames a follower received (tether_edge_pool_bytes_received_total).
func printSummary(res []phaseResult, mres []membersResult) {
	var lag []time.Duration
	var cpu, lan float64
	var rss int64
	members, n := 0, 0
	for _, r := range mres {
		members = r.members
		lag = append(lag, r.lag...)
		cpu = max(cpu, r.changeCPUPct())
		rss = max(rss, r.memAfter.RSS)
		lan += r.lanPerFollower()
		n++
	}
	if len(mres) == 0 {
		for _, r := range res {
			if !r.pool {
				continue
			}
			members = len(r.mem)
			lag = append(lag, r.lag...)
			cpu = max(cpu, pctOf(r.leaderCPU, r.took))
			rss = max(rss, r.mem[r.leader].RSS)
			lan += r.replicated / float64(max(members-1, 1))
			n++
		}
	}
	if n == 0 {
		return
	}
	slices.Sort(lag)
	fmt.Printf("pool: members=%d lag_p99_ms=%s leader_cpu_pct=%.1f leader_rss_mib=%s lan_bytes_per_follower=%.0f\n",
		members, ms(benchkit.Pct(lag, 99)), cpu, mB(rss), lan/float64(n))
}
