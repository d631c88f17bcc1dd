package main

import (
	"slices"
	"testing"
)

// TestNonZero: the service counters' non-zero samples, by exact name
// (not a longer name it prefixes), "name: none" when all are zero.
func TestNonZero(t *testing.T) {
	exp := `# HELP tether_edge_service_streams_total Service streams.
# TYPE tether_edge_service_streams_total counter
tether_edge_service_streams_total{result="error"} 0
tether_edge_service_streams_total{result="ok"} 12050
tether_edge_service_streams_total{result="rate_limited"} 3
tether_edge_service_streams_total_extra{result="ok"} 7
tether_edge_service_refusals_total{result="source"} 0
`
	for _, tc := range []struct {
		name string
		want []string
	}{
		{"tether_edge_service_streams_total", []string{
			`tether_edge_service_streams_total{result="ok"} 12050`,
			`tether_edge_service_streams_total{result="rate_limited"} 3`}},
		{"tether_edge_service_refusals_total", []string{"tether_edge_service_refusals_total: none"}},
		{"tether_gateway_edge_service_streams_total", []string{"tether_gateway_edge_service_streams_total: none"}},
	} {
		if got := nonZero(exp, tc.name); !slices.Equal(got, tc.want) {
			t.Errorf("nonZero(%s) = %q, want %q", tc.name, got, tc.want)
		}
	}
}
