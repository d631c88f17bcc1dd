package main

import (
	"fmt"

	"github.com/tether-edge/tether/e2e/benchplot"
)

// charts are the plots of r: the edges registered against time in the
// cold start, the restart storm and the replica's restart, in one chart
// (none when none of them ran).
func charts(r *results) map[string]benchplot.Chart {
	var lines []benchplot.Line
	add := func(name string, reg *regResult) {
		if reg == nil || len(reg.curve) == 0 {
			return
		}
		// From the gateway's start, when none was registered.
		pts := append([]benchplot.XY{{X: 0, Y: 0}}, reg.curve...)
		lines = append(lines, benchplot.Line{Name: fmt.Sprintf("%s (%d of %d edges)", name, reg.reached, reg.want), Points: pts})
	}
	add("cold start", r.cold)
	if r.storm != nil {
		add("restart storm", &r.storm.reg)
	}
	if r.replicas != nil {
		add("replica restarted beside 2", &r.replicas.back)
	}
	if len(lines) == 0 {
		return nil
	}
	return map[string]benchplot.Chart{
		"registrations": {
			Title: "Edges registered on the gateway's /status after its start",
			X:     "seconds since the gateway started",
			Y:     "edges registered",
			Lines: lines,
		},
	}
}
