// Package testenv starts the real things Tether's tests run against: a
// kube-apiserver with etcd built from their Go modules (and, for tests that
// need node heartbeats judged, kube-controller-manager), a test PKI, and
// hosts in network namespaces joined by veth links, bridges and NAT routers.
//
// Nothing here is a fake. Everything a helper creates is removed by the
// cleanup it registers, also when a test fails; namespaces left behind by a
// killed test process are swept by the next one (their names carry the PID).
//
// No production package imports testenv; tests, e2e/ and the demo do.
package testenv

import (
	"os"
)

// T is the part of testing.TB that testenv needs. *testing.T and
// *testing.B satisfy it, and so does Session, which lets `make demo`
// reuse the same helpers outside a test.
type T interface {
	Helper()
	Cleanup(func())
	Logf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// RequireRoot stops a test that needs root (network namespaces, nftables,
// iptables). Outside CI it skips; under CI (CI=true) it fails, so that a
// CI run can never pass by skipping the tests that matter.
func RequireRoot(t interface {
	T
	Skip(args ...any)
}) {
	t.Helper()
	SkipShort(t)
	requireRoot(t, os.Geteuid(), os.Getenv("CI"))
}

func requireRoot(t interface {
	T
	Skip(args ...any)
}, euid int, ci string) {
	t.Helper()
	if euid == 0 {
		return
	}
	if ci != "" {
		t.Fatalf("this test needs root (network namespaces, netfilter); CI must run as root")
		return
	}
	t.Skip("needs root: run as root or under `make test`")
}
