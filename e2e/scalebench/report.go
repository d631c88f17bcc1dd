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

	"github.com/tether-edge/tether/e2e/benchkit"
	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/tunnel"
)

// keepalive is the simulated edges' keepalive period, the tunnel's default.
var keepalive = tunnel.QUICConfig(tunnel.Limits{}).KeepAlivePeriod

func printHeader(o options, outDir string) {
	var eff []string
	flag.VisitAll(func(f *flag.Flag) {
		if f.Name != "v" {
			eff = append(eff, fmt.Sprintf("--%s=%s", f.Name, f.Value))
		}
	})
	fmt.Printf("scalebench: one tether-gateway, %d simulated edges (issue 18)\n", o.edges)
	fmt.Printf("command:  %s\n", strings.Join(append([]string{filepath.Base(os.Args[0])}, os.Args[1:]...), " "))
	fmt.Printf("settings: %s\n", strings.Join(eff, " "))
	fmt.Printf("machine:  %d CPUs (nproc), load average %s at start, %s\n", runtime.NumCPU(), world.LoadAvg(), runtime.Version())
	fmt.Printf("date:     %s\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Printf("output:   %s (this text and the plots)\n\n", outDir)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }

func mib(n int64) string { return fmt.Sprintf("%.1f", float64(n)/(1<<20)) }

func secs(d time.Duration) string { return fmt.Sprintf("%.1f", d.Seconds()) }

// row prints one line of a result table.
func row(what, value string) { fmt.Printf("  %-44s %s\n", what, value) }

func printResults(o options, r *results) {
	fmt.Println()
	if c := r.cold; c != nil {
		fmt.Printf("cold start (gateway start → every edge on /status):\n")
		row("registered", fmt.Sprintf("%d of %d", c.reached, c.want))
		row("time", secs(c.took)+" s")
		row("gateway peak RSS", mib(c.peakRSS)+" MiB")
		row("gateway CPU", fmt.Sprintf("%.1f s (%.0f%% of a core on average)", c.cpu.Seconds(), 100*c.cpu.Seconds()/c.took.Seconds()))
		row("registrations/s, best 1 s", fmt.Sprintf("%.0f", c.peakRate))
		row("load generator CPU (all edges' handshakes)", fmt.Sprintf("%.1f s", c.agentCPU.Seconds()))
		row("UDP drops, full receive buffer (gateway ns)", fmt.Sprint(c.udpDrops))
	}
	if s := r.steady; s != nil {
		fmt.Printf("steady state (%v, keepalives only):\n", s.took.Round(time.Second))
		row("edges connected (start → end)", fmt.Sprintf("%d → %d", s.before, s.connected))
		if !s.settled {
			row("", "NOT STEADY: not every edge had registered; edges still connecting cost handshakes")
		}
		settled := fmt.Sprintf("%s s after every edge registered", secs(s.settleTook))
		if s.settleRate >= 0 {
			settled += fmt.Sprintf(", at %.1f liveness probes/s", s.settleRate)
		}
		row("measured from", settled)
		row("gateway RSS", fmt.Sprintf("%s MiB, %.1f KiB per edge", mib(s.rss), s.perEdgeKiB()))
		row("gateway CPU", fmt.Sprintf("%.1f%% of a core", s.cpuPct))
		row("UDP datagrams/s in the gateway's namespace", fmt.Sprintf("%.0f in, %.0f out", s.udpIn, s.udpOut))
		row("  of which keepalives, about", fmt.Sprintf("%.0f each way (one PING and its ACK per edge per %v, or less often while quic-go stretches it)", float64(s.connected)/keepalive.Seconds(), keepalive))
		if s.probes >= 0 {
			row("  liveness probes answered/s", fmt.Sprintf("%.1f (a stream each: several datagrams each way)", s.probes))
		}
		row("gateway goroutines", fmt.Sprint(s.goroutines))
		row("load generator", fmt.Sprintf("%d goroutines, %.0f MiB heap", s.agent.Goroutines, s.agent.HeapMiB))
	}
	if r.routeOne != nil || r.routeAll != nil {
		fmt.Printf("routing (new connection + TLS per GET /healthz, %d clients, random edges):\n", o.routeConc)
		for _, x := range []struct {
			label string
			r     *routeResult
		}{
			{"1 edge, its gateway alone (before the fleet)", r.routeOne},
			{fmt.Sprintf("%d edges connected", o.edges), r.routeAll},
			{"1 edge on a replica beside them, in turns", r.routeOneBeside},
		} {
			if x.r == nil {
				continue
			}
			row(x.label, fmt.Sprintf("%.0f req/s, p50 %s ms, p99 %s ms, %d failed", x.r.rate(), ms(x.r.p(50)), ms(x.r.p(99)), x.r.errs))
			if x.r.firstErr != nil {
				row("", "first failure: "+x.r.firstErr.Error())
			}
		}
		if one := r.routeBaseline(); one != nil && r.routeAll != nil && one.p(99) > 0 {
			row("p99 all / p99 one", fmt.Sprintf("%.2f (target ≤ 1.5)", float64(r.routeAll.p(99))/float64(one.p(99))))
			if one != r.routeOne && r.routeOne != nil && r.routeOne.p(99) > 0 {
				row("  against the gateway alone before the fleet", fmt.Sprintf("%.2f (also the machine's load differs)", float64(r.routeAll.p(99))/float64(r.routeOne.p(99))))
			}
		}
	}
	printScrape(o, r.scrape)
	if s := r.storm; s != nil {
		fmt.Printf("restart storm (kill -9, start again):\n")
		row("registered", fmt.Sprintf("%d of %d", s.reg.reached, s.reg.want))
		row("time from the restart (from the kill)", fmt.Sprintf("%s s (%s s)", secs(s.reg.took), secs(s.sinceKil)))
		row("gateway peak RSS", mib(s.reg.peakRSS)+" MiB")
		row("gateway CPU", fmt.Sprintf("%.1f s", s.reg.cpu.Seconds()))
		row("registrations/s, best 1 s / average", fmt.Sprintf("%.0f / %.0f", s.reg.peakRate, float64(s.reg.reached)/s.reg.took.Seconds()))
		row("UDP drops, full receive buffer (gateway ns)", fmt.Sprint(s.reg.udpDrops))
		row("old connections ended by", noticed(s.noticed))
	}
	printLaterPhases(o, r)
	printHealth(r)
	if r.failed != nil {
		fmt.Printf("\nstopped early: %v\n", r.failed)
	}
	fmt.Printf("\nload average at the end: %s\n", world.LoadAvg())
	if r.scrape != nil {
		fmt.Println(scrapeSummary(o, r.scrape))
	}
	fmt.Println(summary(r))
}

// summary is the machine-readable last line; -1 for a phase not run.
func summary(r *results) string {
	rss, cpu, cold, restart, p99, p991, hbRate, hbLost := -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1
	if s := r.steady; s != nil {
		rss, cpu = float64(s.rss)/(1<<20), s.cpuPct
	}
	if c := r.cold; c != nil && c.all() {
		cold = c.took.Seconds()
	}
	if s := r.storm; s != nil && s.reg.all() {
		restart = s.reg.took.Seconds()
	}
	if x := r.routeAll; x != nil {
		p99 = float64(x.p(99)) / float64(time.Millisecond)
	}
	if x := r.routeBaseline(); x != nil {
		p991 = float64(x.p(99)) / float64(time.Millisecond)
	}
	hbRate, hbLost = r.hbSummary()
	f := r.fleets()
	return fmt.Sprintf("scale: edges=%d rss_mib=%.0f idle_cpu_pct=%.1f cold_s=%.1f restart_s=%.1f route_p99_ms=%.2f route_p99_1_ms=%.2f hb_per_s=%.1f hb_lost=%d"+
		" cold_edges=%d storm_edges=%d hb_edges=%d replica_edges=%d replica_s=%.1f replica_route_failed=%d",
		r.connectedAtEnd, rss, cpu, cold, restart, p99, p991, hbRate, hbLost,
		f.cold, f.storm, f.hb, f.replicas, f.replicaS, f.replicaFailed)
}

// fleetSizes are the edges each phase ran with, -1 for a phase not run,
// and the replicas phase's figures.
type fleetSizes struct {
	cold, storm, hb, replicas int
	replicaS                  float64 // the restarted replica had every edge again
	replicaFailed             int     // routing requests failed meanwhile
}

func (r *results) fleets() fleetSizes {
	f := fleetSizes{-1, -1, -1, -1, -1, -1}
	if r.cold != nil {
		f.cold = r.cold.want
	}
	if r.storm != nil {
		f.storm = r.storm.reg.want
	}
	if r.hb != nil {
		f.hb = r.hb.offline
	}
	if x := r.replicas; x != nil {
		f.replicas = x.edges
		if x.back.want > 0 && x.back.all() { // measured, and every edge came back
			f.replicaS = x.back.took.Seconds()
		}
		if x.routing.reqs > 0 {
			f.replicaFailed = x.routing.errs
		}
	}
	return f
}

func printLaterPhases(o options, r *results) {
	if h := r.hb; h != nil {
		fmt.Printf("delegated heartbeats (%d offline edges in %d pools, every %v for %v):\n", h.offline, h.pools, o.hbInterval, o.hbDuration)
		row("renewals sent / answered ok", fmt.Sprintf("%d / %d", h.agent.Sent, h.agent.OK))
		row("renewals written (Lease updates seen)", fmt.Sprintf("%d, %.1f/s (wanted %.1f/s; target ≥ 100/s at 1,000 offline)", h.written, h.rate(), float64(h.offline)/o.hbInterval.Seconds()))
		row("leader send → Lease update seen", fmt.Sprintf("p50 %s ms, p99 %s ms", ms(benchkit.Pct(h.lat, 50)), ms(benchkit.Pct(h.lat, 99))))
		row("leader send → gateway's reply", fmt.Sprintf("p50 %s ms, p99 %s ms", ms(h.agent.ReplyP50), ms(h.agent.ReplyP99)))
		row("lost (sent, not written)", fmt.Sprint(h.lost()))
		if len(h.agent.Errors) > 0 {
			row("refusals and errors", fmt.Sprintf("%v; first: %s", h.agent.Errors, h.agent.FirstErr))
		}
	}
	if c := r.churn; c != nil {
		fmt.Printf("Node churn (%d added and removed per second for %v, each living %v):\n", o.churnRate, o.churnDuration, churnLifetime)
		row("added / removed / failed", fmt.Sprintf("%d / %d / %d in %s s", c.added, c.removed, c.failed, secs(c.took)))
		row("created → answered by the gateway's DNS", fmt.Sprintf("p50 %s ms, p99 %s ms, %d of %d not within %v", ms(benchkit.Pct(c.dns, 50)), ms(benchkit.Pct(c.dns, 99)), c.dnsMiss, c.probes, churnProbeLimit))
		row("created → DNATed to the transparent listener", fmt.Sprintf("p50 %s ms, p99 %s ms, %d of %d not within %v", ms(benchkit.Pct(c.dnat, 50)), ms(benchkit.Pct(c.dnat, 99)), c.dnatMiss, c.probes, churnProbeLimit))
		row("gateway CPU", fmt.Sprintf("%.1f%% of a core", c.cpuPct))
		if c.firstErr != nil {
			row("first failure", c.firstErr.Error())
		}
	}
	if x := r.replicas; x != nil {
		fmt.Printf("3 replicas, one killed -9 and restarted (%d edges, routing through another replica):\n", x.edges)
		row("restarted replica has every edge again", fmt.Sprintf("%d of %d after %s s, peak RSS %s MiB", x.back.reached, x.edges, secs(x.back.took), mib(x.back.peakRSS)))
		row("routing meanwhile", fmt.Sprintf("%d requests, %d failed, p50 %s ms, p99 %s ms", x.routing.reqs, x.routing.errs, ms(x.routing.p(50)), ms(x.routing.p(99))))
		if x.routing.firstErr != nil {
			row("first failure", x.routing.firstErr.Error())
		}
	}
}

// noticed lists how the edges' old connections ended, by reason.
func noticed(m map[string]int64) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for _, reason := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", reason, m[reason]))
	}
	return strings.Join(parts, ", ")
}

// routeBaseline is the one-edge routing the fleet's is judged against:
// measured in turns with it when it was, else before the fleet started.
func (r *results) routeBaseline() *routeResult {
	if r.routeOneBeside != nil {
		return r.routeOneBeside
	}
	return r.routeOne
}

func printScrape(o options, x *scrapeResult) {
	if x == nil {
		return
	}
	fmt.Printf("scrape fan-out (Prometheus on the client host, kubernetes_sd role pod, every %v, by pod IP through the gateway):\n", o.scrapeInterval)
	row("stands in for the edges", "the load generator: the edge tunnel's allow list over an in-memory list of each node's pods, one /metrics server for all pods;")
	row("", "the real edge's pod lookup (nodepods) and real pods are not measured here")
	row("pods, on edges", fmt.Sprintf("%d on %d of %d (a /24 each in %s, port %d, %d B of text format each)", x.pods, x.edges, o.edges, podRanges, scrapePort, len(metricsBody)))
	up := "NOT all up before the window"
	if x.allUp {
		up = fmt.Sprintf("%s s after Prometheus started", secs(x.upAt))
	}
	row("targets found / every one up", fmt.Sprintf("%d / %s", x.discovered, up))
	if x.firstErr != "" {
		row("first scrape error seen", x.firstErr)
	}
	if x.window <= 0 {
		row("window", "not measured")
		return
	}
	row("window", fmt.Sprintf("%s s, between two baselines of %s s", secs(x.window), secs(x.baseline)))
	row("scrapes in the window (Prometheus's samples)", fmt.Sprintf("%d (%.1f/s), %d failed; up at the end %d of %d", x.scrapes, float64(x.scrapes)/x.window.Seconds(), x.failed, x.upEnd, x.pods))
	row("  /metrics answered by the load generator", fmt.Sprint(x.served))
	row("scrape duration (scrape_duration_seconds)", fmt.Sprintf("p50 %s ms, p99 %s ms, max %s ms", ms(benchkit.Pct(x.durations, 50)), ms(benchkit.Pct(x.durations, 99)), ms(benchkit.Pct(x.durations, 100))))
	row(fmt.Sprintf("  scrapes over %v", slowScrape), fmt.Sprintf("%d, in %d distinct seconds of the window, at most %d in one", x.slow, x.slowSeconds, x.slowWorst))
	row("edges' tunnel connections ended meanwhile", noticed(x.ended))
	row("gateway connections relayed and closed", fmt.Sprintf("%.0f in the window; %.0f open at its end (Prometheus keeps them alive)", x.relayed, x.active))
	gross, net := x.cpuPerScrape()
	after := "not measured"
	if x.baseAfter >= 0 {
		after = fmt.Sprintf("%.1f%%", x.baseAfter)
	}
	row("gateway CPU without scrapes (baseline)", fmt.Sprintf("%.1f%% of a core (before Prometheus %.1f%%, after it %s)", x.baselinePct, x.baseBefore, after))
	row("gateway CPU in the window", fmt.Sprintf("%.1f%% of a core, %.1f s", x.cpuPct(), x.cpu.Seconds()))
	row("gateway garbage collections a minute", fmt.Sprintf("%.1f before, %.1f in the window, %.1f after", x.gcPerMin[0], x.gcPerMin[1], x.gcPerMin[2]))
	row("gateway CPU per scrape", fmt.Sprintf("%.3f ms (CPU in the window ÷ scrapes); %.3f ms above the baselines' mean", gross, net))
	row("load generator / Prometheus CPU", fmt.Sprintf("%.1f%% / %.1f%% of a core", 100*x.agentCPU.Seconds()/x.window.Seconds(), 100*x.promCPU.Seconds()/x.window.Seconds()))
}

// scrapeSummary is the scrape phase's machine-readable line.
func scrapeSummary(o options, x *scrapeResult) string {
	p50, p99 := -1.0, -1.0
	if len(x.durations) > 0 {
		p50, p99 = float64(benchkit.Pct(x.durations, 50))/float64(time.Millisecond), float64(benchkit.Pct(x.durations, 99))/float64(time.Millisecond)
	}
	gross, net := x.cpuPerScrape()
	cpuPct := -1.0
	if x.window > 0 {
		cpuPct = x.cpuPct()
	}
	return fmt.Sprintf("scrape: pods=%d up=%d scrapes=%d failed=%d scrape_p50_ms=%.2f scrape_p99_ms=%.2f gateway_cpu_pct=%.1f gateway_cpu_ms_per_scrape=%.3f gateway_net_cpu_ms_per_scrape=%.3f baseline_cpu_pct=%.1f edges=%d",
		x.pods, x.upEnd, x.scrapes, x.failed, p50, p99, cpuPct, gross, net, x.baselinePct, o.edges)
}
