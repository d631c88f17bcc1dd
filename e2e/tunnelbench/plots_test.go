package main

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// fixedSummary: clean, rtt80-loss1 and rtt80-loss3 measured (Konnectivity
// without a bulk figure in rtt80-loss3), rtt30 skipped, and the cut.
func fixedSummary(t *testing.T) (options, summary) {
	t.Helper()
	scs, err := parseScenarios("clean,rtt30,rtt80-loss1,rtt80-loss3,cut")
	if err != nil {
		t.Fatal(err)
	}
	fig := func(hol, bulk float64) *figures {
		return &figures{hasHOL: true, holP99: hol, hasBulk: bulk > 0, bulk: bulk}
	}
	s := summary{scen: map[string]*scenResult{
		"clean":       {fig: map[string]*figures{tetherMode: fig(3, 300), konnMode: fig(4, 250), directMode: fig(1, 900)}},
		"rtt30":       {skipped: "no shaping", fig: map[string]*figures{}},
		"rtt80-loss1": {fig: map[string]*figures{tetherMode: fig(250, 8), konnMode: fig(900, 3)}},
		"rtt80-loss3": {fig: map[string]*figures{tetherMode: fig(400, 3), konnMode: fig(2500, 0)}},
	}}
	return options{scenarios: scs}, s
}

func TestCharts(t *testing.T) {
	o, s := fixedSummary(t)
	c := charts(o, s)
	hol, bulk := c["wan-hol-p99"], c["wan-bulk"]
	if len(c) != 2 || hol.Title == "" || bulk.Title == "" {
		t.Fatalf("charts = %v, want wan-hol-p99 and wan-bulk", c)
	}
	wantGroups := []string{"clean", "rtt80-loss1", "rtt80-loss3"}
	for name, ch := range c {
		if !slices.Equal(ch.Groups, wantGroups) {
			t.Errorf("%s: groups %v, want %v", name, ch.Groups, wantGroups)
		}
		if len(ch.Bars) != 2 || ch.Bars[0].Name != "Tether" || ch.Bars[1].Name != "Konnectivity" {
			t.Errorf("%s: series %v, want Tether and Konnectivity", name, ch.Bars)
		}
	}
	if got := hol.Bars[1].Values; !slices.Equal(got, []float64{4, 900, 2500}) {
		t.Errorf("Konnectivity's hol p99 %v", got)
	}
	if got := bulk.Bars[1].Values; got[0] != 250 || got[1] != 3 || !math.IsNaN(got[2]) {
		t.Errorf("Konnectivity's bulk %v, want 250, 3, NaN (not measured)", got)
	}
	for name, ch := range c {
		svg, err := ch.SVG()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for _, want := range append(wantGroups, "Tether", "Konnectivity", ch.Y, "site uplink (scenario)") {
			if !strings.Contains(string(svg), ">"+want+"<") {
				t.Errorf("%s: no %q in the SVG", name, want)
			}
		}
	}
	// Without Konnectivity: Tether's bars alone.
	for _, r := range s.scen {
		delete(r.fig, konnMode)
	}
	if b := charts(o, s)["wan-bulk"].Bars; len(b) != 1 || b[0].Name != "Tether" {
		t.Errorf("bulk series without Konnectivity: %v", b)
	}
	// Only the cut: no chart.
	o.scenarios = o.scenarios[len(o.scenarios)-1:]
	if c := charts(o, s); c != nil {
		t.Errorf("charts of the cut alone = %v", c)
	}
}

// TestWANLine: the wan: line keeps its keys and order; the pod fields
// come after them, tunnel/pod, then the service fields, pod-direct/
// service, "-" where a mode was not measured and for pod-direct's relay.
func TestWANLine(t *testing.T) {
	o, s := fixedSummary(t)
	o.conc = 32
	want := "wan: hol_p99_ms_1pct=250.0/900.0 hol_p99_ms_3pct=400.0/2500.0 bulk_mbs_clean=300.0/250.0 bulk_mbs_1pct=8.0/3.0 cpu_ns_per_byte=0.00/- heal_s=- nat_rebind=-"
	noPod := " pod_seq_rps=-/- pod_seq_p50_ms=-/- pod_seq_p99_ms=-/- pod_conc_rps=-/- pod_conc_p50_ms=-/- pod_conc_p99_ms=-/- pod_seq_relay_us=-/- pod_conc_relay_us=-/-"
	noSvc := " svc_seq_rps=-/- svc_seq_p50_ms=-/- svc_seq_p99_ms=-/- svc_conc_rps=-/- svc_conc_p50_ms=-/- svc_conc_p99_ms=-/- svc_seq_relay_us=-/- svc_conc_relay_us=-/-"
	if got := wanLine(o, s); got != want+noPod+noSvc {
		t.Errorf("wanLine:\n got %s\nwant %s", got, want+noPod+noSvc)
	}

	// One run of each: n requests in one second, half of them at p50,
	// the slowest n/50+1 at p99, the rest between.
	run := func(n int, p50, p99 time.Duration) rateResult {
		r := rateResult{reqs: n, elapsed: time.Second}
		for i := range n {
			switch {
			case i < n/2:
				r.lat = append(r.lat, p50)
			case i < n-n/50-1:
				r.lat = append(r.lat, (p50+p99)/2)
			default:
				r.lat = append(r.lat, p99)
			}
		}
		return r
	}
	res := func(seq, conc rateResult, relay time.Duration) result {
		return result{seq: seq, conc: conc,
			seqCPU:  cpuUse{tether: relay * time.Duration(seq.reqs)},
			concCPU: cpuUse{tether: relay / 2 * time.Duration(conc.reqs)}}
	}
	s.clean = map[string][]result{
		tetherMode: {res(run(100, 2*time.Millisecond, 4*time.Millisecond), run(200, 20*time.Millisecond, 50*time.Millisecond), 1600*time.Microsecond)},
		podMode:    {res(run(90, 2*time.Millisecond, 5*time.Millisecond), run(180, 22*time.Millisecond, 60*time.Millisecond), 1700*time.Microsecond)},
	}
	withPod := " pod_seq_rps=100/90 pod_seq_p50_ms=2.00/2.00 pod_seq_p99_ms=4.00/5.00 pod_conc_rps=200/180 pod_conc_p50_ms=20.00/22.00 pod_conc_p99_ms=50.00/60.00 pod_seq_relay_us=1600/1700 pod_conc_relay_us=800/850"
	if got := wanLine(o, s); got != want+withPod+noSvc {
		t.Errorf("wanLine with the pod mode:\n got %s\nwant %s", got, want+withPod+noSvc)
	}

	// The service mode beside pod-direct, which has no relay CPU.
	s.clean[podDirectMode] = []result{res(run(300, time.Millisecond, 3*time.Millisecond), run(600, 10*time.Millisecond, 30*time.Millisecond), 0)}
	s.clean[svcMode] = []result{res(run(150, 3*time.Millisecond, 8*time.Millisecond), run(400, 25*time.Millisecond, 70*time.Millisecond), 1200*time.Microsecond)}
	withSvc := " svc_seq_rps=300/150 svc_seq_p50_ms=1.00/3.00 svc_seq_p99_ms=3.00/8.00 svc_conc_rps=600/400 svc_conc_p50_ms=10.00/25.00 svc_conc_p99_ms=30.00/70.00 svc_seq_relay_us=-/1200 svc_conc_relay_us=-/600"
	if got := wanLine(o, s); got != want+withPod+withSvc {
		t.Errorf("wanLine with the pod and service modes:\n got %s\nwant %s", got, want+withPod+withSvc)
	}
}

// TestVersusLine: a line of the comparisons (tunnel -> pod, pod-direct ->
// service) gives both medians and the difference, or "-" and none when
// the first is zero (pod-direct's relay CPU).
func TestVersusLine(t *testing.T) {
	for _, tc := range []struct {
		c      column
		va, vb float64
		want   string
	}{
		{column{head: "seq req/s"}, 400, 300, "  seq req/s               400 ->        300  (-25%)"},
		{column{head: "seq p99", prec: 2}, 4, 5, "  seq p99                4.00 ->       5.00  (+25%)"},
		{column{head: "CPU seq relay", tether: true}, 0, 1600, "  CPU seq relay             - ->       1600"},
	} {
		if got := versusLine(tc.c, tc.va, tc.vb); got != tc.want {
			t.Errorf("versusLine(%q, %v, %v) =\n%q\nwant\n%q", tc.c.head, tc.va, tc.vb, got, tc.want)
		}
	}
}
