//go:build tools

// Package tools pins helm, with which the tests lint, render and install
// the chart packaging/helm/tether (packaging/helm_test.go, e2e). Built from
// its module by tools/build-testbins.sh, never downloaded as a binary.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
