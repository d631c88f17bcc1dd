// Package packaging holds no code: packages, units, config files, images,
// manifests, the Helm chart and monitoring for both programs, and the
// tests that check them against the programs (see README.md).
package packaging

// docs/reference/metrics.md's table is generated from the programs' own
// metric registrations by TestMetricNames (its reference part;
// exported_test.go reads the registrations), which fails when it differs
// from them. It needs root and a real kube-apiserver (make testbins), as
// in make test.
//go:generate go test -count=1 -run TestMetricNames/reference . -args -update
