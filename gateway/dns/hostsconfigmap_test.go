package dns

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/testenv"
)

func TestRenderHosts(t *testing.T) {
	got := renderHosts(records(testSnapshot(), nodewatch.ModeNodeIP, false))
	// Sorted by node name; exact names only; cloud-1 left out.
	want := "10.0.0.1\tedge-1\nfd00::1\tedge-1\n10.0.0.2\tedge-2\n10.0.0.9\tip-10-0-0-9.ec2.internal\n"
	for i := range 60 {
		want += netip.AddrFrom4([4]byte{10, 9, 0, byte(1 + i)}).String() + "\tmany\n"
	}
	want += "10.0.0.3\tn1\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("hosts (-want +got):\n%s", diff)
	}
	got = renderHosts(records(testSnapshot(), nodewatch.ModeVIP, true))
	want = "172.16.0.1\tcloud-1\n100.64.0.1\tedge-1\nfd64::2\tedge-2\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("vip mode with cloud nodes (-want +got):\n%s", diff)
	}
}

func TestParseConfigMapRef(t *testing.T) {
	if ns, name, err := ParseConfigMapRef("kube-system/yurt-tunnel-nodes"); err != nil || ns != "kube-system" || name != "yurt-tunnel-nodes" {
		t.Errorf("got %q %q %v", ns, name, err)
	}
	for _, bad := range []string{"", "x", "/x", "x/", "a/b/c"} {
		if _, _, err := ParseConfigMapRef(bad); err == nil {
			t.Errorf("ParseConfigMapRef(%q) did not fail", bad)
		}
	}
}

// TestHostsWriter checks create, no-op updates, keeping other keys, and
// the retry after a failed write, against the fake clientset.
func TestHostsWriter(t *testing.T) {
	client := fake.NewClientset()
	fails := 1
	client.PrependReactor("create", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if fails > 0 {
			fails--
			return true, nil, errors.New("apiserver unavailable")
		}
		return false, nil, nil
	})
	clk := clocktesting.NewFakeClock(time.Now())
	h := NewHostsWriter(client, HostsOptions{Namespace: "kube-system", Name: "tunnel", Clock: clk})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	snap := testSnapshot()
	h.Update(snap)
	// The first create fails; the retry comes after a second of the clock.
	testenv.Eventually(t, "the writer waiting for the clock", clk.HasWaiters)
	clk.Step(time.Second)
	cm := waitForHosts(t, client, "10.0.0.1\tedge-1\n")

	// Another key of the ConfigMap survives updates.
	cm.Data["other"] = "kept"
	if _, err := client.CoreV1().ConfigMaps("kube-system").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	client.ClearActions()
	h.Update(snap) // same content: no write at all
	snap2 := testSnapshot()
	delete(snap2.Nodes, "edge-1")
	h.Update(snap2)
	cm = waitForHosts(t, client, "10.0.0.2\tedge-2\n")
	if cm.Data["other"] != "kept" {
		t.Errorf("other key lost: %q", cm.Data)
	}
	var writes int
	for _, a := range client.Actions() {
		if a.GetVerb() == "update" || a.GetVerb() == "create" {
			writes++
		}
	}
	if writes != 1 {
		t.Errorf("%d writes for one change, want 1: %v", writes, client.Actions())
	}
}

func waitForHosts(t *testing.T, client *fake.Clientset, prefix string) *corev1.ConfigMap {
	t.Helper()
	var cm *corev1.ConfigMap
	testenv.Eventually(t, "the hosts configmap to start with "+prefix, func() bool {
		c, err := client.CoreV1().ConfigMaps("kube-system").Get(t.Context(), "tunnel", metav1.GetOptions{})
		if err != nil {
			return false
		}
		cm = c
		v := c.Data[DefaultHostsKey]
		return len(v) >= len(prefix) && v[:len(prefix)] == prefix
	})
	return cm
}

// TestRecordsFollowRoutes: DNS and the hosts ConfigMap answer an edge node
// only with the addresses the gateway routes to it: not a cloud node's
// address it claims, not one it shares with another edge (with no first
// holder), in both address modes.
func TestRecordsFollowRoutes(t *testing.T) {
	snap := &nodewatch.Snapshot{Version: 1, Nodes: map[string]nodewatch.Node{
		"edge-1":  {Name: "edge-1", Edge: true, InternalIPs: addrs("10.0.0.1"), VIP: netip.MustParseAddr("100.64.0.1")},
		"edge-2":  {Name: "edge-2", Edge: true, InternalIPs: addrs("10.0.0.1", "10.0.0.2"), VIP: netip.MustParseAddr("100.64.0.1")},
		"evil":    {Name: "evil", Edge: true, InternalIPs: addrs("172.16.0.1")},
		"cloud-1": {Name: "cloud-1", InternalIPs: addrs("172.16.0.1")},
	}}
	got := renderHosts(records(snap, nodewatch.ModeNodeIP, true))
	want := "172.16.0.1\tcloud-1\n10.0.0.2\tedge-2\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("node-ip (-want +got):\n%s", diff)
	}
	if got := renderHosts(records(snap, nodewatch.ModeVIP, false)); got != "" {
		t.Errorf("vip mode answers a VIP two edges claim: %q", got)
	}
}
