package docgen

import (
	"go/parser"
	"go/token"
	"slices"
	"strings"
	"testing"
)

// TestMetricSources fails when production code breaks the metrics
// convention: MustRegister outside internal/promreg and internal/admin,
// collectors built outside a metrics.go, Namespace or Subsystem instead of
// the full name, promauto.
func TestMetricSources(t *testing.T) {
	problems, err := CheckMetricSources("../..", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

func TestMetricStyle(t *testing.T) {
	for _, tc := range []struct {
		m    Metric
		want []string // a word of each problem, in order
	}{
		{Metric{Name: "tether_gateway_edges", Type: "gauge", Help: "Edges with a live tunnel."}, nil},
		{Metric{Name: "tether_gateway_streams_total", Type: "counter", Help: "Streams opened, by result: ok or refused."}, nil},
		{Metric{Name: "tether_gateway_streams_total", Help: "Streams opened; the type is not known."}, nil},
		{Metric{Name: "gateway_edges", Type: "gauge", Help: "Edges."}, []string{"tether_"}},
		{Metric{Name: "tether_gatewayEdges", Type: "gauge", Help: "Edges."}, []string{"snake"}},
		{Metric{Name: "tether_gateway_streams", Type: "counter", Help: "Streams."}, []string{"_total"}},
		{Metric{Name: "tether_gateway_streams_total", Type: "gauge", Help: "Streams."}, []string{"only a counter"}},
		{Metric{Name: "tether_gateway_streams", Type: "gauge"}, []string{"empty"}},
		{Metric{Name: "tether_gateway_streams", Type: "gauge", Help: "streams"}, []string{"capital", "period"}},
		{Metric{Name: "tether_gateway_streams", Type: "gauge", Help: "Streams. Open ones."}, []string{"one sentence"}},
		{Metric{Name: "tether_gateway_streams", Type: "gauge", Help: "Streams open within 3s."}, []string{"number"}},
		{Metric{Name: "tether_gateway_streams", Type: "gauge", Help: "Streams" + strings.Repeat(" open", 23) + "."}, []string{"characters"}},
	} {
		got := MetricStyle(tc.m)
		ok := len(got) == len(tc.want)
		for i := 0; ok && i < len(got); i++ {
			ok = strings.Contains(got[i], tc.want[i])
		}
		if !ok {
			t.Errorf("MetricStyle(%+v) = %q, want problems naming %q", tc.m, got, tc.want)
		}
	}
}

func TestCheckFile(t *testing.T) {
	const src = `package p

import (
	prom "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promauto"
)

func New(reg prom.Registerer) {
	c := prom.NewCounter(prom.CounterOpts{Namespace: "tether", Name: "x_total", Help: "X."})
	reg.MustRegister(c)
	_ = prom.NewRegistry()
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"5: promauto",
		"9: prometheus.NewCounter outside metrics.go",
		"9: Namespace in prometheus.CounterOpts",
		"10: MustRegister",
	}
	check := func(rel string, want []string) {
		t.Helper()
		got := checkFile(fset, f, rel)
		ok := len(got) == len(want)
		for i := 0; ok && i < len(got); i++ {
			ok = strings.HasPrefix(got[i], rel+":"+want[i])
		}
		if !ok {
			t.Errorf("checkFile(%s) = %q, want lines starting %q", rel, got, want)
		}
	}
	check("p/p.go", want)
	// In a metrics.go the constructor is where it belongs; in
	// internal/admin, MustRegister is allowed.
	check("p/metrics.go", slices.Delete(slices.Clone(want), 1, 2))
	check("internal/admin/metrics.go", slices.Delete(slices.Clone(want), 1, 2)[:2])
}

func TestSkipped(t *testing.T) {
	skip := []string{"poolstore/", "edgeproxy/*.go"}
	for rel, want := range map[string]bool{
		"poolstore/":               true,
		"poolstore/pool.go":        true,
		"poolstorex/a.go":          false,
		"edgeproxy/edgeproxy.go":   true,
		"edgeproxy/cache/store.go": false,
		"edgeproxy/cache/":         false,
	} {
		if got := skipped(rel, skip); got != want {
			t.Errorf("skipped(%q) = %v, want %v", rel, got, want)
		}
	}
}
