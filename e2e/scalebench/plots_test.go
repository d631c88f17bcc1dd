package main

import (
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/e2e/benchplot"
)

// fixedResults is a small run: 200 edges, 100 on the replicas, every
// phase but churn.
func fixedResults() *results {
	curve := func(n int) []benchplot.XY {
		return []benchplot.XY{{X: 1, Y: float64(n / 4)}, {X: 2, Y: float64(n / 2)}, {X: 3, Y: float64(n)}}
	}
	return &results{
		edges:          200,
		connectedAtEnd: 200,
		cold:           &regResult{want: 200, reached: 200, took: 3 * time.Second, curve: curve(200)},
		steady:         &steadyResult{rss: 100 << 20, cpuPct: 1.5},
		routeOne:       &routeResult{lat: []time.Duration{time.Millisecond}},
		routeAll:       &routeResult{lat: []time.Duration{2 * time.Millisecond}},
		storm:          &stormResult{reg: regResult{want: 200, reached: 200, took: 2500 * time.Millisecond, curve: curve(200)}},
		hb:             &hbPhase{offline: 20, took: time.Second, written: 2, agent: hbResult{Sent: 2}},
		replicas: &replicaResult{
			edges:   100,
			back:    regResult{want: 100, reached: 100, took: 1500 * time.Millisecond, curve: curve(100)},
			routing: routeResult{reqs: 50, errs: 1},
		},
	}
}

func TestSummary(t *testing.T) {
	got := summary(fixedResults())
	// The keys of the first version, in their order, then the fleets.
	want := "scale: edges=200 rss_mib=100 idle_cpu_pct=1.5 cold_s=3.0 restart_s=2.5 route_p99_ms=2.00 route_p99_1_ms=1.00 hb_per_s=2.0 hb_lost=0" +
		" cold_edges=200 storm_edges=200 hb_edges=20 replica_edges=100 replica_s=1.5 replica_route_failed=1"
	if got != want {
		t.Errorf("summary:\n got %s\nwant %s", got, want)
	}
	// A run of the cold start alone: the other phases' figures are -1.
	got = summary(&results{edges: 5, connectedAtEnd: 5, cold: &regResult{want: 5, reached: 4, took: time.Second}})
	if !strings.HasSuffix(got, " cold_edges=5 storm_edges=-1 hb_edges=-1 replica_edges=-1 replica_s=-1.0 replica_route_failed=-1") || !strings.Contains(got, " cold_s=-1.0 ") {
		t.Errorf("summary of a cold start that missed an edge: %s", got)
	}
	// The replicas phase stopped before its restart: no time, no routing.
	r := fixedResults()
	r.replicas = &replicaResult{edges: 100}
	if got = summary(r); !strings.HasSuffix(got, " replica_edges=100 replica_s=-1.0 replica_route_failed=-1") {
		t.Errorf("summary of a replicas phase that stopped early: %s", got)
	}
}

func TestCharts(t *testing.T) {
	c := charts(fixedResults())
	reg, ok := c["registrations"]
	if !ok || len(c) != 1 {
		t.Fatalf("charts = %v, want one, registrations", c)
	}
	var names []string
	for _, l := range reg.Lines {
		names = append(names, l.Name)
		if p := l.Points[0]; p != (benchplot.XY{}) {
			t.Errorf("%s starts at %v, want the gateway's start at 0 edges", l.Name, p)
		}
	}
	want := "cold start (200 of 200 edges)|restart storm (200 of 200 edges)|replica restarted beside 2 (100 of 100 edges)"
	if got := strings.Join(names, "|"); got != want {
		t.Errorf("lines %s, want %s", got, want)
	}
	svg, err := reg.SVG()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"seconds since the gateway started", "edges registered", "restart storm (200 of 200 edges)"} {
		if !strings.Contains(string(svg), ">"+s+"<") {
			t.Errorf("no %q in the SVG", s)
		}
	}
	if c := charts(&results{}); c != nil {
		t.Errorf("charts of no phase = %v", c)
	}
}
