// Package metrictest reads single values out of Prometheus collectors for
// the gateway's tests.
package metrictest

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Value returns the value of the counter or gauge series name{labels} that
// c collects, where labels are given as "key=value" pairs and must match the
// series' labels exactly. A series that is not there reads as 0, as it would
// in PromQL's absent-means-zero arithmetic; an error is returned only when c
// cannot be gathered.
func Value(c prometheus.Collector, name string, labels ...string) (float64, error) {
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		return 0, fmt.Errorf("register collector: %w", err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		return 0, fmt.Errorf("gather: %w", err)
	}
	want := map[string]string{}
	for _, l := range labels {
		k, v, _ := strings.Cut(l, "=")
		want[k] = v
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if match(m.GetLabel(), want) {
				switch {
				case m.Counter != nil:
					return m.GetCounter().GetValue(), nil
				case m.Gauge != nil:
					return m.GetGauge().GetValue(), nil
				}
			}
		}
	}
	return 0, nil
}

func match(got []*dto.LabelPair, want map[string]string) bool {
	if len(got) != len(want) {
		return false
	}
	for _, lp := range got {
		if v, ok := want[lp.GetName()]; !ok || v != lp.GetValue() {
			return false
		}
	}
	return true
}
