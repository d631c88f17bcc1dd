//go:build tools

// Package tools pins promtool, which checks and unit-tests the Prometheus
// alerting rules in packaging/monitoring (packaging/monitoring_test.go runs
// `promtool test rules`), and Prometheus itself, which the e2e tests run as
// the scraper of edge pods. Both are built from this one module version by
// tools/build-testbins.sh, never downloaded as binaries.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
