package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/tether-edge/tether/e2e/world"
)

func kernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

func quicVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/quic-go/quic-go" {
				return d.Version
			}
		}
	}
	return "unknown"
}

func printHeader(o options, outDir string) {
	var eff []string
	flag.VisitAll(func(f *flag.Flag) {
		if f.Name != "v" {
			eff = append(eff, fmt.Sprintf("--%s=%s", f.Name, f.Value))
		}
	})
	fmt.Printf("tunnelbench: Tether tunnel vs direct, bare quic-go and Konnectivity, clean and on WAN links (issues 9, 19)\n")
	fmt.Printf("command:  %s\n", strings.Join(append([]string{filepath.Base(os.Args[0])}, os.Args[1:]...), " "))
	fmt.Printf("settings: %s\n", strings.Join(eff, " "))
	fmt.Printf("machine:  %d CPUs (nproc), load average %s at start, Linux %s, %s, quic-go %s\n",
		runtime.NumCPU(), world.LoadAvg(), kernel(), runtime.Version(), quicVersion())
	fmt.Printf("date:     %s\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Printf("output:   %s (this text and the plots)\n\n", outDir)
}

// median of the values f takes over runs.
func median(runs []result, f func(result) float64) float64 {
	v := make([]float64, len(runs))
	for i, r := range runs {
		v[i] = f(r)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// column is one column of a table.
type column struct {
	head   string
	f      func(result) float64
	prec   int
	bulk   bool // also for bulk-only modes
	tether bool // only for modes through tether-gateway and tether-edge
}

func columns(o options) []column {
	return []column{
		{head: "seq req/s", f: func(r result) float64 { return r.seq.rate() }},
		{head: "seq p50", f: func(r result) float64 { return ms(r.seq.pct(50)) }, prec: 2},
		{head: "seq p99", f: func(r result) float64 { return ms(r.seq.pct(99)) }, prec: 2},
		{head: fmt.Sprintf("c%d req/s", o.conc), f: func(r result) float64 { return r.conc.rate() }},
		{head: fmt.Sprintf("c%d p50", o.conc), f: func(r result) float64 { return ms(r.conc.pct(50)) }, prec: 2},
		{head: fmt.Sprintf("c%d p99", o.conc), f: func(r result) float64 { return ms(r.conc.pct(99)) }, prec: 2},
		{head: "bulk MB/s", f: func(r result) float64 { return r.bulk.mbps() }, bulk: true},
	}
}

func cpuColumns(o options) []column {
	perReq := func(d time.Duration, r rateResult) float64 {
		return float64(d) / float64(time.Microsecond) / float64(max(r.reqs, 1))
	}
	perByte := func(d time.Duration, b bulkResult) float64 { return float64(d) / float64(max(b.bytes, 1)) }
	c := fmt.Sprintf("c%d", o.conc)
	return []column{
		{head: "seq relay", f: func(r result) float64 { return perReq(r.seqCPU.tether, r.seq) }, tether: true},
		{head: "seq all", f: func(r result) float64 { return perReq(r.seqCPU.all(), r.seq) }},
		{head: c + " relay", f: func(r result) float64 { return perReq(r.concCPU.tether, r.conc) }, tether: true},
		{head: c + " all", f: func(r result) float64 { return perReq(r.concCPU.all(), r.conc) }},
		{head: "bulk relay", f: func(r result) float64 { return perByte(r.bulkCPU.tether, r.bulk) }, prec: 2, bulk: true, tether: true},
		{head: "bulk all", f: func(r result) float64 { return perByte(r.bulkCPU.all(), r.bulk) }, prec: 2, bulk: true},
	}
}

// printGrid prints the medians of cols for every mode, "-" where a column
// does not apply.
func printGrid(modes []mode, res map[string][]result, cols []column, width int) {
	fmt.Printf("%-12s", "mode")
	for _, c := range cols {
		fmt.Printf(" %*s", width, c.head)
	}
	fmt.Println()
	for _, m := range modes {
		fmt.Printf("%-12s", m.name)
		for _, c := range cols {
			if (m.bulkOnly && !c.bulk) || (m.pids == nil && c.tether) {
				fmt.Printf(" %*s", width, "-")
				continue
			}
			fmt.Printf(" %*.*f", width, c.prec, median(res[m.name], c.f))
		}
		fmt.Println()
	}
}

func printTable(o options, modes []mode, res map[string][]result) {
	fmt.Printf("new connections: one HTTPS GET /healthz per new TCP connection and TLS handshake; seq = %d one after\n", o.seq)
	fmt.Printf("the other, c%d = %d from %d concurrent clients (the modes take turns every %d and %d requests);\n", o.conc, o.concReqs, o.conc, seqTurn, concTurn*o.conc)
	fmt.Printf("latencies in ms. bulk: one GET /bytes of %d MiB on one connection, MB = 10^6 bytes. Medians of %d runs.\n\n", o.bulk>>20, o.runs)
	printGrid(modes, res, columns(o), 11)
	fmt.Println()
	for _, m := range modes {
		fmt.Printf("%-12s %s\n", m.name, m.desc)
	}

	fmt.Printf("\nCPU time (user+system), µs per request and ns per byte; relay = the tunnel's two processes (tether-gateway +\n")
	fmt.Printf("tether-edge, or proxy-server + proxy-agent), all = that plus this process (client and stand-in servers; both\n")
	fmt.Printf("ends of bare quic-go). Medians of %d runs.\n\n", o.runs)
	printGrid(modes, res, cpuColumns(o), 13)
	if o.runs > 1 {
		fmt.Printf("\nevery run (seq req/s, c%d req/s, c%d p99 ms, bulk MB/s):\n", o.conc, o.conc)
		for _, m := range modes {
			fmt.Printf("%-12s", m.name)
			for _, r := range res[m.name] {
				if m.bulkOnly {
					fmt.Printf("  [%.0f]", r.bulk.mbps())
				} else {
					fmt.Printf("  [%.0f %.0f %.1f %.0f]", r.seq.rate(), r.conc.rate(), ms(r.conc.pct(99)), r.bulk.mbps())
				}
			}
			fmt.Println()
		}
	}
	var errs []string
	for _, m := range modes {
		for i, r := range res[m.name] {
			if n := r.seq.errs + r.conc.errs; n > 0 {
				errs = append(errs, fmt.Sprintf("%s run %d: %d failed requests (first: %v)", m.name, i+1, n, firstErr(r)))
			}
		}
	}
	for _, e := range errs {
		fmt.Println(e)
	}
}

func firstErr(r result) error {
	if r.seq.firstErr != nil {
		return r.seq.firstErr
	}
	return r.conc.firstErr
}

func printTargets(o options, res map[string][]result) {
	cols := columns(o)
	tun, dir, bare := res["tunnel"], res["direct"], res["bare-quic"]
	bulkT, bulkB := median(tun, cols[6].f), median(bare, cols[6].f)
	seqT, seqD := median(tun, cols[0].f), median(dir, cols[0].f)
	p99T, p99D := median(tun, cols[5].f), median(dir, cols[5].f)
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "missed"
	}
	fmt.Printf("\ntargets (issue 9), on the medians:\n")
	fmt.Printf("  %-46s %-44s %s\n", "bulk: tunnel >= 80% of bare quic-go",
		fmt.Sprintf("%.0f%% (%.0f of %.0f MB/s)", 100*bulkT/bulkB, bulkT, bulkB), verdict(bulkT >= 0.8*bulkB))
	fmt.Printf("  %-46s %-44s %s\n", "sequential new conns: tunnel >= 50% of direct",
		fmt.Sprintf("%.0f%% (%.0f of %.0f req/s)", 100*seqT/seqD, seqT, seqD), verdict(seqT >= 0.5*seqD))
	fmt.Printf("  %-46s %-44s %s\n", fmt.Sprintf("p99 at %d concurrent: tunnel <= 10 ms", o.conc),
		fmt.Sprintf("%.2f ms (direct: %.2f ms)", p99T, p99D), verdict(p99T <= 10))
	if path, ok := res["quic-path"]; ok {
		bulkP := median(path, cols[6].f)
		fmt.Printf("  (context: tunnel bulk is %.0f%% of bare quic-go over the tunnel's own path, %.0f MB/s)\n", 100*bulkT/bulkP, bulkP)
	}
	if base, ok := res["baseline"]; ok {
		fmt.Printf("\ntunnel against --baseline (same world, interleaved runs), on the medians:\n")
		printVersus(o, base, tun)
	}
	if pod, ok := res[podMode]; ok {
		fmt.Printf("\npod against tunnel (the same stand-in by a pod address and by the node's, same gateway and edge,\n")
		fmt.Printf("interleaved runs), on the medians: tunnel -> pod:\n")
		printVersus(o, tun, pod)
	}
	if svc, ok := res[svcMode]; ok {
		fmt.Printf("\nservice against pod-direct (a client in the edge pod's namespace to the same cloud stand-in by a marked\n")
		fmt.Printf("Service's ClusterIP through tether-edge and the gateway, and by its address through the site's NAT, interleaved\n")
		fmt.Printf("runs; relay: pod-direct has none), on the medians: pod-direct -> service:\n")
		printVersus(o, res[podDirectMode], svc)
	}
}

// printVersus prints every column's median of a and b side by side, with
// b's difference from a; "-" for a and the difference where a is zero
// (a's relay CPU when a has no relay).
func printVersus(o options, a, b []result) {
	all := columns(o)
	for _, c := range cpuColumns(o) {
		c.head = "CPU " + c.head
		all = append(all, c)
	}
	for _, c := range all {
		fmt.Println(versusLine(c, median(a, c.f), median(b, c.f)))
	}
}

// versusLine is one line of printVersus: column c's medians va and vb,
// with vb's difference from va; "-" for va and no difference where va
// is zero.
func versusLine(c column, va, vb float64) string {
	if va == 0 {
		return fmt.Sprintf("  %-16s %10s -> %10.*f", c.head, "-", c.prec, vb)
	}
	return fmt.Sprintf("  %-16s %10.*f -> %10.*f  (%+.0f%%)", c.head, c.prec, va, c.prec, vb, 100*(vb-va)/va)
}
