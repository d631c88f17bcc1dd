package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// TestDemoTour runs `make demo-tour`'s program once (--tour --once), as an
// operator would: it exits non-zero when a step does not show what it
// claims, and each step prints what it showed.
func TestDemoTour(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.Binaries(t) // built before the clock starts
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", "./e2e/demo", "--tour", "--once", "--bin-dir", filepath.Dir(bins.Gateway))
	cmd.Dir = world.RepoRoot()
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo --tour --once: %v\n%s", err, out)
	}
	t.Logf("the tour ran in %v", time.Since(start).Round(time.Second))
	var missing []string
	for _, want := range []string{
		"ok edge-1", "ok edge-3", "TLS verified", // the tunnel part
		"the kubelets on edge-1 and edge-2 posted their Nodes Ready through tether-edge",
		"the kubelets on edge-1 and edge-2 admitted and run their Pods",
		"shown: kube-proxy on edge-1 programs 10.244.1.10 10.244.2.10 (edge-1 and edge-2, its pool), not 10.244.3.10",
		"programs 10.244.1.10 only (its own node), without a restart",
		"answered from tether-edge's cache",
		"marked openyurt.io/delegate-heartbeat=true",
		"the hollow kubelet on edge-", // renewed the delegated Lease
		"has the taint node.openyurt.io/unschedulable=true:NoSchedule",
		"is still Ready=True",
		"is untainted and Ready",
		"web-edge-3 container web, line 1: served by the kubelet of edge-3",
		"tour: all 3 steps shown",
		"demo: cleaned up",
	} {
		if !strings.Contains(string(out), want) {
			missing = append(missing, want)
		}
	}
	if missing != nil {
		t.Errorf("the tour's output lacks %q:\n%s", missing, out)
	}
}
