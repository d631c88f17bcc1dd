// Command kubeletbench is `make bench-kubelet`: the benchmark of one edge
// node with the kubelet's own code (kubemark's hollow node) and --pods
// pods, through tether-edge and straight to kube-apiserver (the baseline),
// in one run on one machine. It builds the e2e world once (a real
// kube-apiserver and etcd in a cloud network whose audit log records every
// request, tether-gateway on a cloud host, two edge sites behind NAT) and
// runs two hollow kubelets side by side:
//
//   - through: edge-1's kubelet talks to tether-edge (the product's
//     defaults, plus --cache-components for the hollow kubelet's
//     User-Agent), which speaks for the node with the node's certificate;
//   - straight: edge-2's kubelet talks to kube-apiserver itself with the
//     node's certificate.
//
// Each gets --pods pods with ConfigMap and Secret volumes, env from both,
// a downward API volume and the projected service-account token every
// pod has by default (world.CreateWorkload). kube-apiserver counts the
// requests, from its audit log (world.AuditLog), by the node's user
// (system:node:<name>): tether-edge's own requests count with the
// kubelet's, as they are made with the node's certificate. Then:
//
//  1. steady: after --settle, requests per minute from each node over
//     --steady, by verb and resource, and tether-edge's RSS (VmRSS at the
//     end) and CPU (utime+stime over the window) online;
//  2. online restart: both kubelets are killed (SIGKILL) and started
//     again with the cloud reachable; the requests each node makes in
//     the --restart-window after the new kubelet's start, and the seconds
//     until the kubelet runs every pod again (its own /runningpods/);
//  3. offline: edge-2's kubelet becomes a second kubelet through
//     tether-edge, with --pods pods without a service-account token
//     (NoToken); both sites' uplinks are cut, and tether-edge's RSS and
//     CPU on edge-1 over --offline-window;
//  4. offline restart: on each edge in turn (the pods without a token
//     first), kubelet and tether-edge are killed (SIGKILL) and started
//     again with the uplink still cut, as after a power cut; the seconds
//     from the kubelet's start to all pods running, bounded by
//     --offline-bound. A restart that does not get there says how many
//     pods ran and why the others did not, from the kubelet's log.
//
// It prints tables and how the node fares against the targets: the
// cache adds no request to the kubelet's (those tether-edge forwards,
// told from its own health checks and node pool by their User-Agent),
// online and after a restart; an offline restart within 30 s. It
// asserts nothing. Its last line is machine-readable:
//
//	kubelet: pods=<n> steady_rpm_through=<> steady_rpm_straight=<> steady_rpm_edge_own=<> restart_requests_through=<> restart_requests_straight=<> restart_run_s_through=<> restart_run_s_straight=<> edge_rss_mib_online=<> edge_cpu_pct_online=<> edge_rss_mib_offline=<> edge_cpu_pct_offline=<> offline_run_s=<> offline_running=<> offline_run_s_notoken=<> offline_running_notoken=<>
//
// where a restart whose pods did not all run within the bound reads "-".
// The text output and SVG plots (requests per minute by kind in steady
// state; requests after the online restart against time) are written
// into --out. Timings on a shared machine vary with its load, which it
// prints at start and end.
//
// It needs root (network namespaces) and the component binaries
// (testenv.Binaries: kube-apiserver, etcd, kubemark), and uses only
// addresses inside the namespaces it creates and loopback; everything is
// removed at the end, also on Ctrl-C.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/e2e/benchplot"
	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

type options struct {
	binDir        string
	pods          int
	settle        time.Duration
	steady        time.Duration
	restartWindow time.Duration
	offlineWindow time.Duration
	offlineBound  time.Duration
	timeout       time.Duration
	verbose       bool
	outDir        string
}

func main() {
	var o options
	flag.StringVar(&o.binDir, "bin-dir", "", "`dir` holding tether-edge and tether-gateway, as make build leaves them in bin; empty builds them from this tree into a temporary directory")
	flag.IntVar(&o.pods, "pods", 30, "`n` pods on each node (1..100)")
	flag.DurationVar(&o.settle, "settle", 30*time.Second, "wait this `duration` after every pod runs before the steady window")
	flag.DurationVar(&o.steady, "steady", 3*time.Minute, "count the nodes' requests and tether-edge's CPU online over this `duration`")
	flag.DurationVar(&o.restartWindow, "restart-window", time.Minute, "count the nodes' requests for this `duration` after the online restart")
	flag.DurationVar(&o.offlineWindow, "offline-window", time.Minute, "measure tether-edge's CPU offline over this `duration`")
	flag.DurationVar(&o.offlineBound, "offline-bound", time.Minute, "give an offline restart this `duration` to run every pod (the target is 30 s)")
	flag.DurationVar(&o.timeout, "timeout", 20*time.Minute, "give up after this `duration` (world setup included)")
	flag.BoolVar(&o.verbose, "verbose", false, "log the world's setup")
	flag.StringVar(&o.outDir, "out", "", benchplot.Help("kubeletbench"))
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: kubeletbench [flags]\n\nBenchmarks one edge node with the kubelet's own code (kubemark's hollow node) and its pods, through tether-edge and straight to kube-apiserver: requests per minute counted by kube-apiserver, an online restart, tether-edge's RSS and CPU online and offline, and an offline restart, in network namespaces on this machine (needs root).\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if o.pods < 1 || o.pods > 100 || o.steady <= 0 || o.restartWindow <= 0 || o.offlineWindow <= 0 || o.offlineBound <= 0 || o.settle < 0 {
		fmt.Fprintf(os.Stderr, "kubeletbench: --pods must be 1..100, the windows and --offline-bound positive\n")
		os.Exit(2)
	}
	world.RunBenchOut("kubeletbench", o.verbose, o.timeout, o.outDir, func(ctx context.Context, s *testenv.Session, out *benchplot.Out) error {
		return run(ctx, s, o, out)
	})
}

func note(format string, args ...any) {
	benchkit.Note(os.Stderr, "kubeletbench", false, format, args...)
}
