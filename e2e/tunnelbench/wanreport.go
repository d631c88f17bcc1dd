package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/tether-edge/tether/tunnel"
)

// Names of the modes the WAN report compares.
const (
	tetherMode = "tunnel"
	konnMode   = "konnectivity"
	directMode = "direct"
	bareMode   = "bare-quic"
)

// printScenario prints one scenario's table as soon as it is done.
func printScenario(o options, sr *scenResult, modes []mode) {
	fmt.Printf("\nscenario %s: %s", sr.sc.name, sr.sc.desc)
	if sr.rttMs > 0 {
		fmt.Printf(" (tunnel RTT %.1f ms at the gateway)", sr.rttMs)
	}
	fmt.Println()
	if sr.skipped != "" {
		fmt.Printf("  not run: %s\n", sr.skipped)
		return
	}
	c := fmt.Sprintf("c%d", o.conc)
	heads := []string{"hol p50", "hol p99", "hol n/err", "hol bulk", "bulk MB/s", "relay ns/B", "seq req/s", "seq p99", c + " req/s", c + " p99"}
	fmt.Printf("%-13s", "mode")
	for _, h := range heads {
		fmt.Printf(" %10s", h)
	}
	fmt.Println()
	var errs []string
	for _, m := range modes {
		f := sr.fig[m.name]
		if f == nil {
			continue
		}
		fmt.Printf("%-13s", m.name)
		cell := func(ok bool, prec int, v float64) {
			if !ok {
				fmt.Printf(" %10s", "-")
				return
			}
			fmt.Printf(" %10.*f", prec, v)
		}
		cell(f.hasHOL, 1, f.holP50)
		cell(f.hasHOL, 1, f.holP99)
		if f.hasHOL {
			fmt.Printf(" %10s", fmt.Sprintf("%d/%d", f.holN, f.holErr))
		} else {
			fmt.Printf(" %10s", "-")
		}
		cell(f.hasHOL, 1, f.holBulk)
		cell(f.hasBulk, 1, f.bulk)
		cell(f.hasBulk && (m.pids != nil || (m.name == bareMode && sr.sc.name == "clean")), 2, f.cpuNsB)
		cell(f.hasRate, 0, f.seqRate)
		cell(f.hasRate, 1, f.seqP99)
		cell(f.hasRate, 0, f.concRate)
		cell(f.hasRate, 1, f.concP99)
		fmt.Println()
		if n := f.holErr + f.seqErr + f.concErr; n > 0 {
			errs = append(errs, fmt.Sprintf("  %s: %d failed requests (first: %v)", m.name, n, f.firstErr))
		}
	}
	fmt.Printf("hol: %d clients make new-connection GETs for %v while one connection downloads (hol bulk: its MB/s meanwhile);\n", o.holClients, o.wanTime)
	fmt.Printf("latencies in ms, failed requests counted at their duration. relay ns/B: CPU of the tunnel's two processes per byte\n")
	fmt.Printf("(bare-quic: both ends). ")
	if sr.sc.name == "clean" {
		fmt.Printf("bulk and new connections: medians of the full measurement above.\n")
	} else {
		fmt.Printf("bulk: one connection (quic-path: one quic-go stream between the edge\nand gateway hosts over the same shaped path, no relay) for %v; new connections: %v seq and %v c%d per mode, in turns.\n", o.wanTime, o.wanTime/2, o.wanTime/2, o.conc)
	}
	for _, e := range errs {
		fmt.Println(e)
	}
}

func printCut(cr *cutResult) {
	fmt.Printf("\nscenario cut: the site's uplink down %v, then %v with a request in flight\n", cr.long, cr.shortDur)
	for _, m := range []string{tetherMode, konnMode} {
		d, ok := cr.first[m]
		if !ok {
			continue
		}
		if d < 0 {
			fmt.Printf("  %-13s first successful new-connection request after the heal: none within %v\n", m, healWait)
		} else {
			fmt.Printf("  %-13s first successful new-connection request after the heal: %.2f s\n", m, d.Seconds())
		}
	}
	switch {
	case cr.registered >= 0:
		fmt.Printf("  %-13s registered again at the gateway %.2f s after the heal\n", tetherMode, cr.registered.Seconds())
	case !cr.dropped:
		fmt.Printf("  %-13s never dropped by the gateway during the cut\n", tetherMode)
	default:
		fmt.Printf("  %-13s not registered again within %v of the heal\n", tetherMode, healWait)
	}
	for _, m := range []string{tetherMode, konnMode, directMode} {
		if a, ok := cr.after[m]; ok {
			fmt.Printf("  %-13s after the heal: %s\n", m, a)
		}
	}
	qc := tunnel.QUICConfig(tunnel.Limits{})
	fmt.Printf("  (tunnel settings: QUIC idle timeout %v, keep-alive every %v; the edge redials with a jittered backoff\n", qc.MaxIdleTimeout, qc.KeepAlivePeriod)
	fmt.Printf("  from 1 s doubling up to 30 s; a cut shorter than the idle timeout keeps the connection and its streams)\n")
	for _, m := range []string{tetherMode, konnMode} {
		if s, ok := cr.short[m]; ok {
			fmt.Printf("  %-13s request in flight across the %v cut: %s\n", m, cr.shortDur, s)
		}
	}
}

func printNAT(nr *natResult) {
	fmt.Printf("\nscenario nat: %d MiB downloads read at %d MiB/s; %v in, the site router flushes conntrack and masquerades from ports %d-%d\n",
		nr.bytes>>20, nr.rate>>20, nr.rebindAfter, nr.newPortLo, nr.newPort)
	for _, m := range []string{tetherMode, konnMode} {
		if s, ok := nr.downloads[m]; ok {
			fmt.Printf("  %-13s download %s\n", m, s)
		}
	}
	for _, m := range []string{tetherMode, konnMode, directMode} {
		if a, ok := nr.after[m]; ok {
			fmt.Printf("  %-13s after the downloads: %s\n", m, a)
		}
	}
	fmt.Printf("  tunnel: %s: %s\n", nr.verdict, nr.why)
	fmt.Printf("  the site router maps the tunnel's flow to %s now; the gateway's /status shows the edge at %s (before: %s)\n", nr.mapping, nr.remoteAfter, nr.remoteBefore)
}

// summary is what the targets and the last line are computed from.
type summary struct {
	tcpCC string // the TCP congestion control Konnectivity's WAN leg used
	scen  map[string]*scenResult
	cut   *cutResult
	nat   *natResult
	// clean is the full measurement's results (every mode's runs), for
	// the pod fields of the last line.
	clean map[string][]result
}

func (s summary) fig(scen, mode string) *figures {
	if r := s.scen[scen]; r != nil && r.skipped == "" {
		return r.fig[mode]
	}
	return nil
}

// pair formats t/k with prec decimals, "-" for what was not measured.
func pair(t, k *figures, ok func(*figures) bool, v func(*figures) float64, prec int) string {
	one := func(f *figures) string {
		if f == nil || !ok(f) {
			return "-"
		}
		return fmt.Sprintf("%.*f", prec, v(f))
	}
	return one(t) + "/" + one(k)
}

func hasHOL(f *figures) bool  { return f.hasHOL }
func hasBulk(f *figures) bool { return f.hasBulk }

func printSummary(o options, s summary) {
	fmt.Printf("\nTether (tunnel) against Konnectivity across the scenarios (T/K; Konnectivity's TCP: %s, quic-go: NewReno):\n", s.tcpCC)
	fmt.Printf("%-13s %16s %12s %16s %12s %16s %22s\n", "scenario", "hol p99 ms", "hol ratio", "bulk MB/s", "bulk ratio", "relay ns/B", fmt.Sprintf("c%d p99 ms T/K/direct", o.conc))
	for _, sc := range o.scenarios {
		if sc.event {
			continue
		}
		t, k, d := s.fig(sc.name, tetherMode), s.fig(sc.name, konnMode), s.fig(sc.name, directMode)
		if t == nil {
			fmt.Printf("%-13s not run\n", sc.name)
			continue
		}
		ratio := func(ok func(*figures) bool, v func(*figures) float64) string {
			if k == nil || !ok(t) || !ok(k) || v(k) == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f", v(t)/v(k))
		}
		c32 := pair(t, k, func(f *figures) bool { return f.hasRate }, func(f *figures) float64 { return f.concP99 }, 1)
		if d != nil && d.hasRate {
			c32 += fmt.Sprintf("/%.1f", d.concP99)
		}
		fmt.Printf("%-13s %16s %12s %16s %12s %16s %22s\n", sc.name,
			pair(t, k, hasHOL, func(f *figures) float64 { return f.holP99 }, 1), ratio(hasHOL, func(f *figures) float64 { return f.holP99 }),
			pair(t, k, hasBulk, func(f *figures) float64 { return f.bulk }, 1), ratio(hasBulk, func(f *figures) float64 { return f.bulk }),
			pair(t, k, hasBulk, func(f *figures) float64 { return f.cpuNsB }, 2), c32)
	}

	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "missed"
	}
	line := func(target, value string, known, ok bool) {
		v := "not measured"
		if known {
			v = verdict(ok)
		}
		fmt.Printf("  %-58s %-40s %s\n", target, value, v)
	}
	fmt.Printf("\ntargets (issue 19):\n")
	for _, sc := range []string{"rtt80-loss1", "rtt80-loss3"} {
		t, k := s.fig(sc, tetherMode), s.fig(sc, konnMode)
		known := t != nil && k != nil && t.hasHOL && k.hasHOL
		line(fmt.Sprintf("head-of-line p99, %s: Tether <= 1/3 of Konnectivity", sc), pair(t, k, hasHOL, func(f *figures) float64 { return f.holP99 }, 1)+" ms",
			known, known && 3*t.holP99 <= k.holP99)
	}
	allBulk, lossBulk, known := true, true, false
	var worst []string
	for _, sc := range o.scenarios {
		t, k := s.fig(sc.name, tetherMode), s.fig(sc.name, konnMode)
		if sc.event || t == nil || k == nil || !t.hasBulk || !k.hasBulk {
			continue
		}
		known = true
		switch {
		case t.bulk < k.bulk:
			allBulk = false
			worst = append(worst, sc.name)
		case sc.link.Loss > 0 && t.bulk < 2*k.bulk:
			lossBulk = false
			worst = append(worst, sc.name+" (< 2x)")
		}
		if sc.link.Loss > 0 && t.bulk < 2*k.bulk {
			lossBulk = false
		}
	}
	bv := "see the table"
	if len(worst) > 0 {
		bv = "short in " + strings.Join(worst, ", ")
	}
	line("bulk: Tether >= Konnectivity everywhere, >= 2x under loss", bv, known, allBulk && lossBulk)
	t, b := s.fig("clean", tetherMode), s.fig("clean", bareMode)
	cpuKnown := t != nil && b != nil && t.hasBulk && b.hasBulk && b.cpuNsB > 0
	cv := "-"
	if cpuKnown {
		cv = fmt.Sprintf("%.2f vs %.2f ns/byte: %.2fx", t.cpuNsB, b.cpuNsB, t.cpuNsB/b.cpuNsB)
	}
	line("clean CPU per byte: Tether <= 1.5x bare quic-go", cv, cpuKnown, cpuKnown && t.cpuNsB <= 1.5*b.cpuNsB)
	healKnown := s.cut != nil && s.cut.first[tetherMode] >= 0
	hv := "-"
	if s.cut != nil {
		hv = secs(s.cut.first[tetherMode])
	}
	line("heal after a 30 s cut: first request <= 2 s", hv, s.cut != nil, healKnown && s.cut.first[tetherMode] <= 2*time.Second)
	nv := "-"
	if s.nat != nil {
		nv = s.nat.verdict
	}
	line("NAT rebinding: the download survives, no reconnect", nv, s.nat != nil, s.nat != nil && s.nat.verdict == "survived")
}

func secs(d time.Duration) string {
	if d < 0 {
		return "never"
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// wanLine is the machine-readable last line.
func wanLine(o options, s summary) string {
	hol := func(sc string) string {
		return pair(s.fig(sc, tetherMode), s.fig(sc, konnMode), hasHOL, func(f *figures) float64 { return f.holP99 }, 1)
	}
	bulk := func(sc string) string {
		return pair(s.fig(sc, tetherMode), s.fig(sc, konnMode), hasBulk, func(f *figures) float64 { return f.bulk }, 1)
	}
	cpu := pair(s.fig("clean", tetherMode), s.fig("clean", bareMode), hasBulk, func(f *figures) float64 { return f.cpuNsB }, 2)
	heal, nat := "-", "-"
	if s.cut != nil {
		if d := s.cut.first[tetherMode]; d >= 0 {
			heal = fmt.Sprintf("%.2f", d.Seconds())
		} else {
			heal = "never"
		}
	}
	if s.nat != nil {
		nat = s.nat.verdict
	}
	return fmt.Sprintf("wan: hol_p99_ms_1pct=%s hol_p99_ms_3pct=%s bulk_mbs_clean=%s bulk_mbs_1pct=%s cpu_ns_per_byte=%s heal_s=%s nat_rebind=%s",
		hol("rtt80-loss1"), hol("rtt80-loss3"), bulk("clean"), bulk("rtt80-loss1"), cpu, heal, nat) + podFields(o, s) + svcFields(o, s)
}

// podFields are the pod mode's fields of the last line: each is
// tunnel/pod (the node's address against a pod's, through the same
// gateway and edge), medians of the clean measurement, "-" for what was
// not measured; conc is the concurrent measurement (--conc clients),
// relay_us the CPU of tether-gateway and tether-edge per request.
func podFields(o options, s summary) string {
	return versusFields(o, s, "pod", tetherMode, podMode)
}

// svcFields are the service mode's fields of the last line, after the
// pod ones: each is pod-direct/service (a client in the edge pod's
// namespace to the same cloud stand-in by its address through the
// site's NAT, and by a marked Service's ClusterIP through tether-edge
// and the gateway), as podFields; pod-direct's relay_us is "-" (no
// relay on its path).
func svcFields(o options, s summary) string {
	return versusFields(o, s, "svc", podDirectMode, svcMode)
}

// versusFields are the fields <prefix>_seq_rps, ... <prefix>_conc_relay_us,
// each a/b: the medians of modes a and b in the clean measurement, "-"
// for a mode not measured and for relay CPU where a mode's is zero (a
// mode without tether-gateway and tether-edge).
func versusFields(o options, s summary, prefix, a, b string) string {
	cols, cpuCols := columns(o), cpuColumns(o)
	fields := []struct {
		name string
		c    column
	}{
		{"seq_rps", cols[0]}, {"seq_p50_ms", cols[1]}, {"seq_p99_ms", cols[2]},
		{"conc_rps", cols[3]}, {"conc_p50_ms", cols[4]}, {"conc_p99_ms", cols[5]},
		{"seq_relay_us", cpuCols[0]}, {"conc_relay_us", cpuCols[2]},
	}
	one := func(rs []result, c column) string {
		if len(rs) == 0 {
			return "-"
		}
		v := median(rs, c.f)
		if c.tether && v == 0 {
			return "-"
		}
		return fmt.Sprintf("%.*f", c.prec, v)
	}
	var sb strings.Builder
	for _, f := range fields {
		fmt.Fprintf(&sb, " %s_%s=%s/%s", prefix, f.name, one(s.clean[a], f.c), one(s.clean[b], f.c))
	}
	return sb.String()
}
