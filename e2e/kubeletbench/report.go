package main

import (
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/tether-edge/tether/e2e/world"
)

// targetOffline is the bound on an offline restart (issue 29).
const targetOffline = 30 * time.Second

func printHeader(o options, outDir string) {
	var eff []string
	flag.VisitAll(func(f *flag.Flag) {
		eff = append(eff, fmt.Sprintf("--%s=%s", f.Name, f.Value))
	})
	fmt.Printf("kubeletbench: one edge node with the kubelet's own code (kubemark's hollow node) and %d pods, through tether-edge and straight to kube-apiserver\n", o.pods)
	fmt.Printf("command:  %s\n", strings.Join(append([]string{filepath.Base(os.Args[0])}, os.Args[1:]...), " "))
	fmt.Printf("settings: %s\n", strings.Join(eff, " "))
	fmt.Printf("machine:  %d CPUs (nproc), load average %s at start, %s\n", runtime.NumCPU(), world.LoadAvg(), runtime.Version())
	fmt.Printf("date:     %s\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Printf("output:   %s (this text and the plots)\n\n", outDir)
}

// perMinute is n requests over d, per minute.
func perMinute(n int, d time.Duration) float64 { return float64(n) / d.Minutes() }

// byKind counts requests by "verb resource".
func byKind(reqs []world.AuditRequest) map[string]int {
	m := map[string]int{}
	for _, r := range reqs {
		m[r.Kind()]++
	}
	return m
}

// byAgent counts requests by User-Agent product.
func byAgent(reqs []world.AuditRequest) map[string]int {
	m := map[string]int{}
	for _, r := range reqs {
		m[r.Agent]++
	}
	return m
}

// tetherEdge tells tether-edge's own requests (its health checks, its
// node pool: User-Agent tether-edge, tether-edge-pool) from those it
// forwards for the node's components, which keep their User-Agent.
func tetherEdge(r world.AuditRequest) bool { return strings.HasPrefix(r.Agent, "tether-edge") }

// split counts the requests tether-edge makes on its own and the others.
func split(reqs []world.AuditRequest) (components, own int) {
	for _, r := range reqs {
		if tetherEdge(r) {
			own++
		} else {
			components++
		}
	}
	return components, own
}

// noMoreThan reports whether a is at most b, give or take 5 % and one
// request (two runs of the same kubelet differ by that much).
func noMoreThan(a, b int) bool { return float64(a) <= 1.05*float64(b)+1 }

// failed counts requests answered with a status of 400 or more.
func failed(reqs []world.AuditRequest) int {
	n := 0
	for _, r := range reqs {
		if r.Code >= 400 {
			n++
		}
	}
	return n
}

// kinds are the request kinds of both modes, most frequent first.
func kinds(through, straight map[string]int) []string {
	all := map[string]int{}
	for k, v := range through {
		all[k] += v
	}
	for k, v := range straight {
		all[k] += v
	}
	ks := slices.Sorted(maps.Keys(all))
	slices.SortStableFunc(ks, func(a, b string) int { return all[b] - all[a] })
	return ks
}

// printKinds prints the two modes' requests by kind, scaled by scale
// (1 for counts, 1/minutes for rates).
func printKinds(through, straight []world.AuditRequest, scale float64, format string) {
	t, s := byKind(through), byKind(straight)
	fmt.Printf("  %-44s %10s %10s %10s\n", "verb resource", "through", "straight", "difference")
	row := func(name string, a, b int) {
		fa, fb := float64(a)*scale, float64(b)*scale
		fmt.Printf("  %-44s %10s %10s %10s\n", name, fmt.Sprintf(format, fa), fmt.Sprintf(format, fb), fmt.Sprintf("%+"+format[1:], fa-fb))
	}
	for _, k := range kinds(t, s) {
		row(k, t[k], s[k])
	}
	row("total", len(through), len(straight))
	row("of which answered 4xx/5xx", failed(through), failed(straight))
	fmt.Printf("  through, by User-Agent:")
	ag := byAgent(through)
	for _, a := range slices.Sorted(maps.Keys(ag)) {
		fmt.Printf(" %s %s", a, fmt.Sprintf(format, float64(ag[a])*scale))
	}
	fmt.Println()
}

func printReport(o options, r *results) {
	th, st := r.steady["through"], r.steady["straight"]
	fmt.Printf("1. Online steady state: requests per minute from the node to kube-apiserver, counted by kube-apiserver (audit log, user system:node:<node>), over %v starting %v after every pod ran; through: edge-1's kubelet via tether-edge (whose own requests, made with the node's certificate, count too); straight: edge-2's kubelet with the node's certificate\n",
		r.steadyWindow.Round(time.Second), o.settle)
	printKinds(th, st, 1/r.steadyWindow.Minutes(), "%.1f")

	fmt.Printf("\n2. Online restart (kubelet killed with SIGKILL and started again, cloud reachable, both nodes at once): requests from the node in the %v after the new kubelet's start, and the time until its runtime runs all %d pods again\n", r.restartWindow, r.pods)
	rt, rs := r.restart["through"], r.restart["straight"]
	fmt.Printf("  %-10s %-36s %10s\n", "mode", "all pods running again after", "requests")
	for _, m := range []string{"through", "straight"} {
		x := r.restart[m]
		fmt.Printf("  %-10s %-36s %10d\n", m, x.run, len(x.reqs))
	}
	printKinds(rt.reqs, rs.reqs, 1, "%.0f")

	fmt.Printf("\n3. tether-edge on edge-1 with the kubelet and %d pods: RSS (VmRSS at the window's end, VmHWM the peak) and CPU (utime+stime over the window, %% of one core)\n", r.pods)
	fmt.Printf("  %-44s %8s %9s %8s %8s\n", "window", "RSS MiB", "peak MiB", "CPU s", "CPU %")
	for _, x := range []struct {
		name string
		p    procSample
	}{
		{fmt.Sprintf("online, steady (%v)", r.edgeOnline.window.Round(time.Second)), r.edgeOnline},
		{fmt.Sprintf("offline, uplink cut (%v)", r.edgeOffline.window.Round(time.Second)), r.edgeOffline},
	} {
		fmt.Printf("  %-44s %8s %9s %8.2f %8.2f\n", x.name, mib(x.p.mem.RSS), mib(x.p.mem.HWM), x.p.cpu.Seconds(), x.p.cpuPct())
	}
	fmt.Printf("  (tether-edge found the cloud unhealthy %.1f s after the cut, with its default health checks)\n", r.offlineAfter.Seconds())

	fmt.Printf("\n4. Offline restart (uplink cut; kubelet and tether-edge killed with SIGKILL and started again, still cut): from the kubelet's start to its runtime running all %d pods, bounded by %v (target at most %v)\n", r.pods, o.offlineBound, targetOffline)
	for _, x := range []struct {
		name string
		r    runResult
	}{
		{"pods with a service-account token (the default; edge-1)", r.offline},
		{"pods without a token (NoToken; edge-2)", r.offlineNoToken},
	} {
		fmt.Printf("  %-58s %s\n", x.name, x.r)
		if !x.r.all {
			fmt.Printf("    not running: %s\n", strings.Join(x.r.missing[:min(5, len(x.r.missing))], ", ")+more(len(x.r.missing), 5))
			fmt.Printf("    first reasons in the kubelet's log (count× message):\n")
			for _, reason := range x.r.reasons {
				fmt.Printf("      %s\n", reason)
			}
			if len(x.r.reasons) == 0 {
				fmt.Printf("      (none logged about these pods)\n")
			}
		}
	}

	fmt.Printf("\ntargets (\"the kubelet's\": the requests tether-edge forwards for it, by their User-Agent; met within 5 %% and one request):\n")
	w := r.steadyWindow
	comp, own := split(th)
	stComp, _ := split(st)
	fmt.Printf("  the cache adds no request online: the kubelet's %.1f requests/min through against %.1f straight (%+.1f): %s\n",
		perMinute(comp, w), perMinute(stComp, w), perMinute(comp, w)-perMinute(stComp, w), verdict(noMoreThan(comp, stComp)))
	fmt.Printf("    with tether-edge's own requests as the node (health checks, node pool) %.1f/min: through %.1f, straight %.1f, difference %+.1f requests/min\n",
		perMinute(own, w), perMinute(len(th), w), perMinute(len(st), w), perMinute(len(th), w)-perMinute(len(st), w))
	rComp, rOwn := split(rt.reqs)
	rsComp, _ := split(rs.reqs)
	fmt.Printf("  an online restart without a storm: the kubelet's %d requests through against %d straight in %v (tether-edge's own: %d more): %s\n",
		rComp, rsComp, r.restartWindow, rOwn, verdict(noMoreThan(rComp, rsComp)))
	for _, x := range []struct {
		name string
		r    runResult
	}{{"with tokens", r.offline}, {"without tokens", r.offlineNoToken}} {
		fmt.Printf("  an offline restart within %v (%s): %v: %s\n", targetOffline, x.name, x.r, verdict(x.r.all && x.r.took <= targetOffline))
	}
}

func more(n, shown int) string {
	if n <= shown {
		return ""
	}
	return fmt.Sprintf(" and %d more", n-shown)
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func mib(n int64) string { return fmt.Sprintf("%.1f", float64(n)/(1<<20)) }

func printSummary(r *results) {
	rpm := func(m string) float64 { return perMinute(len(r.steady[m]), r.steadyWindow) }
	_, own := split(r.steady["through"])
	fmt.Printf("kubelet: pods=%d steady_rpm_through=%.1f steady_rpm_straight=%.1f steady_rpm_edge_own=%.1f restart_requests_through=%d restart_requests_straight=%d restart_run_s_through=%s restart_run_s_straight=%s edge_rss_mib_online=%s edge_cpu_pct_online=%.2f edge_rss_mib_offline=%s edge_cpu_pct_offline=%.2f offline_run_s=%s offline_running=%d offline_run_s_notoken=%s offline_running_notoken=%d\n",
		r.pods, rpm("through"), rpm("straight"), perMinute(own, r.steadyWindow),
		len(r.restart["through"].reqs), len(r.restart["straight"].reqs),
		r.restart["through"].run.seconds(), r.restart["straight"].run.seconds(),
		mib(r.edgeOnline.mem.RSS), r.edgeOnline.cpuPct(), mib(r.edgeOffline.mem.RSS), r.edgeOffline.cpuPct(),
		r.offline.seconds(), r.offline.ran, r.offlineNoToken.seconds(), r.offlineNoToken.ran)
}
