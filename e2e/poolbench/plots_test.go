package main

import (
	"strings"
	"testing"
	"time"
)

func TestCharts(t *testing.T) {
	lag := func(ms ...int) []time.Duration {
		var d []time.Duration
		for _, m := range ms {
			d = append(d, time.Duration(m)*time.Millisecond)
		}
		return d
	}
	mem := map[string]procMem{"edge-1": {}, "edge-2": {}, "edge-3": {}}
	res := []phaseResult{
		{phase: phaseNoPool, run: 1, mem: mem},
		{phase: phasePool, run: 1, pool: true, mem: mem, lag: lag(5, 1, 3)},
		{phase: phasePool, run: 2, pool: true, mem: mem, lag: lag(2)},
	}
	mres := []membersResult{{run: 1, members: 100, lag: lag(10, 20)}}
	c := charts(res, mres)
	ch, ok := c["pool-lag"]
	if !ok || len(c) != 1 {
		t.Fatalf("charts = %v, want pool-lag", c)
	}
	if len(ch.Lines) != 3 {
		t.Fatalf("%d lines, want pool, members and the target", len(ch.Lines))
	}
	pool, members, target := ch.Lines[0], ch.Lines[1], ch.Lines[2]
	if want := "pool: 3 tether-edge, followers' informers (4 receipts)"; pool.Name != want {
		t.Errorf("pool line %q, want %q", pool.Name, want)
	}
	if last := pool.Points[len(pool.Points)-1]; last.X != 5 || last.Y != 100 {
		t.Errorf("pool ECDF ends at %v, want 5 ms at 100 %%", last)
	}
	if want := "members: a pool of 100, followers' replicas (2 receipts)"; members.Name != want {
		t.Errorf("members line %q, want %q", members.Name, want)
	}
	if target.Points[0].X != 100 {
		t.Errorf("target line at %v ms, want 100", target.Points[0].X)
	}
	svg, err := ch.SVG()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"lag (ms)", "% of follower receipts with at most this lag", pool.Name, members.Name} {
		if !strings.Contains(string(svg), ">"+strings.ReplaceAll(want, "'", "&#39;")+"<") {
			t.Errorf("no %q in the SVG", want)
		}
	}
	// The members phase alone, and no phase with a lag.
	if c := charts(nil, mres); len(c["pool-lag"].Lines) != 2 {
		t.Errorf("members alone: %v", c)
	}
	if c := charts(res[:1], nil); c != nil {
		t.Errorf("no-pool alone: %v", c)
	}
}
