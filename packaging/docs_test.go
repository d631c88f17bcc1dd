package packaging_test

import (
	"flag"
	"fmt"
	"slices"
	"strings"

	"github.com/tether-edge/tether/internal/docgen"
)

var update = flag.Bool("update", false, "write docs/reference/metrics.md's generated metric table instead of checking it")

// metricTable is docs/reference/metrics.md's metric table (the region "metrics"), from
// what the programs export: every tether_* metric with its type, labels
// and help. A labelled metric with no series yet shows no type; the
// names say it then: a counter's ends in _total, and no other's does
// (checked on the metrics whose type is known).
func metricTable(programs []string, exports map[string]exported) (string, error) {
	var sections []docgen.MetricSection
	var errs []string
	for _, prog := range programs {
		s := docgen.MetricSection{Program: prog}
		for name, f := range exports[prog] {
			if !strings.HasPrefix(name, "tether_") {
				continue
			}
			typ := f.typ
			counterName := strings.HasSuffix(name, "_total")
			switch {
			case typ == "":
				typ = "gauge"
				if counterName {
					typ = "counter"
				}
			case (typ == "counter") != counterName:
				errs = append(errs, fmt.Sprintf("%s is a %s: name counters, and only counters, ..._total", name, typ))
			}
			if strings.TrimSpace(f.help) == "" {
				errs = append(errs, name+" has no help")
			}
			var labels []string
			for _, l := range f.labels {
				if !slices.Contains(labels, l) {
					labels = append(labels, l)
				}
			}
			s.Metrics = append(s.Metrics, docgen.Metric{Name: name, Type: typ, Labels: labels, Help: f.help})
		}
		sections = append(sections, s)
	}
	if len(errs) > 0 {
		return "", fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return docgen.MetricTable(sections), nil
}
