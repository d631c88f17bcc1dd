package packaging_test

import (
	"strings"
	"testing"

	"github.com/tether-edge/tether/internal/docgen"
)

// TestMetricStyle fails when a metric either program registers breaks the
// metrics convention (docgen.MetricStyle): tether_ and snake case, counters
// and only counters named ..._total, Help one sentence of at most
// docgen.MaxHelp characters with no number in it. The Go runtime's and the
// process's metrics (go_, process_), which admin.NewRegistry adds, are
// Prometheus's own.
func TestMetricStyle(t *testing.T) {
	gw, edge := exportedByPrograms(t)
	for prog, e := range map[string]exported{"tether-gateway": gw, "tether-edge": edge} {
		var ms []docgen.Metric
		for name, f := range e {
			if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
				continue
			}
			ms = append(ms, docgen.Metric{Name: name, Type: f.typ, Help: f.help})
		}
		for _, p := range docgen.CheckMetricStyle(ms) {
			t.Errorf("%s: %s", prog, p)
		}
	}
}
