package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoClientset keeps client-go's clientset out of tether-edge: it
// registers every built-in API group at start, which costs an idle edge
// node megabytes of memory (see internal/kube). Only the gateway and
// tetherctl use it.
func TestNoClientset(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 100 {
		t.Fatalf("go list -deps gave %d packages: %q", len(deps), out)
	}
	for _, d := range deps {
		for _, banned := range []string{
			"k8s.io/client-go/kubernetes", // the clientset, its scheme and typed clients
			"k8s.io/client-go/informers",
			"k8s.io/client-go/tools/leaderelection",
			"k8s.io/client-go/util/certificate",
			"k8s.io/client-go/testing", // gentype's fakes and their managed-fields machinery
		} {
			if d == banned || strings.HasPrefix(d, banned+"/") {
				t.Errorf("tether-edge imports %s (go list -deps; go mod why -m shows who)", d)
			}
		}
	}
}
