package main

import (
	"fmt"
	"time"

	"github.com/tether-edge/tether/e2e/benchplot"
)

// charts are the plots of the phases: the distribution of the
// replication lag (pool-lag), one line for the pool phases' follower
// receipts and one for the members phases', all runs together, with the
// target marked. None when neither ran.
func charts(res []phaseResult, mres []membersResult) map[string]benchplot.Chart {
	var lines []benchplot.Line
	var pool []float64
	edges := 0
	for _, r := range res {
		if r.pool {
			pool = append(pool, msOf(r.lag)...)
			edges = len(r.mem)
		}
	}
	if len(pool) > 0 {
		lines = append(lines, benchplot.ECDF(fmt.Sprintf("pool: %d tether-edge, followers' informers (%d receipts)", edges, len(pool)), pool))
	}
	var members []float64
	size := 0
	for _, r := range mres {
		members = append(members, msOf(r.lag)...)
		size = r.members
	}
	if len(members) > 0 {
		lines = append(lines, benchplot.ECDF(fmt.Sprintf("members: a pool of %d, followers' replicas (%d receipts)", size, len(members)), members))
	}
	if len(lines) == 0 {
		return nil
	}
	t := msOf([]time.Duration{targetLag})[0]
	lines = append(lines, benchplot.Line{Name: fmt.Sprintf("target: p99 at most %.0f ms", t), Points: []benchplot.XY{{X: t, Y: 0}, {X: t, Y: 99}}})
	return map[string]benchplot.Chart{
		"pool-lag": {
			Title: "Replication lag: a follower receiving each change after the leader",
			X:     "lag (ms)",
			Y:     "% of follower receipts with at most this lag",
			Lines: lines,
		},
	}
}

func msOf(d []time.Duration) []float64 {
	out := make([]float64, len(d))
	for i, v := range d {
		out[i] = float64(v) / float64(time.Millisecond)
	}
	return out
}
