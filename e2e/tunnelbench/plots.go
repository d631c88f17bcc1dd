package main

import (
	"math"

	"github.com/tether-edge/tether/e2e/benchplot"
)

// charts are the plots of s: in each link scenario that ran, in the order
// of o.scenarios (loss grows from clean to rtt80-loss3), Tether beside
// Konnectivity: the head-of-line p99 (wan-hol-p99) and one connection's
// bulk throughput (wan-bulk). None when no link scenario ran.
func charts(o options, s summary) map[string]benchplot.Chart {
	var groups []string
	for _, sc := range o.scenarios {
		if !sc.event && s.fig(sc.name, tetherMode) != nil {
			groups = append(groups, sc.name)
		}
	}
	if len(groups) == 0 {
		return nil
	}
	series := func(ok func(*figures) bool, v func(*figures) float64) []benchplot.Bars {
		var out []benchplot.Bars
		for _, m := range []struct{ mode, name string }{{tetherMode, "Tether"}, {konnMode, "Konnectivity"}} {
			b := benchplot.Bars{Name: m.name}
			measured := false
			for _, g := range groups {
				f := s.fig(g, m.mode)
				if f == nil || !ok(f) {
					b.Values = append(b.Values, math.NaN())
					continue
				}
				measured = true
				b.Values = append(b.Values, v(f))
			}
			if measured {
				out = append(out, b)
			}
		}
		return out
	}
	c := map[string]benchplot.Chart{}
	const x = "site uplink (scenario)"
	if b := series(hasHOL, func(f *figures) float64 { return f.holP99 }); len(b) > 0 {
		c["wan-hol-p99"] = benchplot.Chart{
			Title: "Head-of-line p99: new-connection GETs during one download",
			X:     x, Y: "p99 (ms)", Groups: groups, Bars: b,
		}
	}
	if b := series(hasBulk, func(f *figures) float64 { return f.bulk }); len(b) > 0 {
		c["wan-bulk"] = benchplot.Chart{
			Title: "Bulk throughput of one connection",
			X:     x, Y: "MB/s", Groups: groups, Bars: b,
		}
	}
	return c
}
