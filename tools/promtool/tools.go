//go:build tools

// Package tools pins promtool, which checks and unit-tests the Prometheus
// alerting rules in packaging/monitoring (packaging/monitoring_test.go runs
// `promtool test rules`). Built from its module by tools/build-testbins.sh,
// never downloaded as a binary.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
