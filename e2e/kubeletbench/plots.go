package main

import (
	"fmt"
	"slices"
	"time"

	"github.com/tether-edge/tether/e2e/benchplot"
	"github.com/tether-edge/tether/e2e/world"
)

// plotKinds is how many request kinds the steady plot shows, the most
// frequent.
const plotKinds = 8

// charts are the run's plots: the steady requests per minute by kind,
// through beside straight (kubelet-steady), and the requests after the
// online restart against time (kubelet-restart).
func charts(r *results) map[string]benchplot.Chart {
	out := map[string]benchplot.Chart{}
	th, st := byKind(r.steady["through"]), byKind(r.steady["straight"])
	if ks := kinds(th, st); len(ks) > 0 {
		ks = ks[:min(plotKinds, len(ks))]
		bars := []benchplot.Bars{{Name: "through tether-edge"}, {Name: "straight to kube-apiserver"}}
		for _, k := range ks {
			bars[0].Values = append(bars[0].Values, perMinute(th[k], r.steadyWindow))
			bars[1].Values = append(bars[1].Values, perMinute(st[k], r.steadyWindow))
		}
		out["kubelet-steady"] = benchplot.Chart{
			Title:  fmt.Sprintf("Requests per minute from a node with %d pods, online", r.pods),
			X:      "verb resource",
			Y:      "requests per minute",
			Groups: ks,
			Bars:   bars,
		}
	}
	var lines []benchplot.Line
	for _, m := range []string{"through", "straight"} {
		x, ok := r.restart[m]
		if !ok {
			continue
		}
		lines = append(lines, cumulative(fmt.Sprintf("%s (%d requests)", m, len(x.reqs)), x, r.restartWindow))
	}
	if len(lines) > 0 {
		out["kubelet-restart"] = benchplot.Chart{
			Title: fmt.Sprintf("Requests after an online restart of the kubelet (%d pods)", r.pods),
			X:     "seconds since the new kubelet's start",
			Y:     "requests so far",
			Lines: lines,
		}
	}
	return out
}

// cumulative is the number of requests received up to each request and
// to the window's end.
func cumulative(name string, x restart, window time.Duration) benchplot.Line {
	l := benchplot.Line{Name: name, Points: []benchplot.XY{{X: 0, Y: 0}}}
	for i, q := range sortedByTime(x.reqs) {
		l.Points = append(l.Points, benchplot.XY{X: q.Received.Sub(x.at).Seconds(), Y: float64(i + 1)})
	}
	l.Points = append(l.Points, benchplot.XY{X: window.Seconds(), Y: float64(len(x.reqs))})
	return l
}

func sortedByTime(reqs []world.AuditRequest) []world.AuditRequest {
	out := slices.Clone(reqs)
	slices.SortStableFunc(out, func(a, b world.AuditRequest) int { return a.Received.Compare(b.Received) })
	return out
}
