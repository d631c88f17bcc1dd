package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// kubeletSite is a shop with one node: the hollow kubelet's world.
func kubeletSite() world.Options {
	return world.Options{Sites: []testenv.SiteSpec{
		{Name: "shop", Hosts: []string{"edge-1"}, LAN: netip.MustParsePrefix("192.168.9.0/24")},
	}}
}

// TestKubeletOfflineRestart runs the kubelet's own code (kubemark's hollow
// node) behind tether-edge through a power cut with the uplink down: the
// site is cut, kubelet and tether-edge are killed and started again while
// still offline, and every pod that ran before runs again — with its
// ConfigMap, Secret, downward API, local PersistentVolume and
// service-account token volumes. After
// the heal the node is Ready, the same pods run under the same UIDs, and
// the status writes made offline are accounted for.
func TestKubeletOfflineRestart(t *testing.T) {
	w := world.New(t, bins, kubeletSite(), t.Logf)
	w.ApplyEdgeRBAC(t)
	w.CP.StartControllerManager(t, testenv.ControllerManagerOptions{NodeMonitorGracePeriod: 12 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	admin := w.CP.Client
	e := w.Edges[0]

	w.StartGateway(t, w.Gateways[0])
	w.RouteSitesVia(t, w.Gateways[0])
	edgeArgs := append(w.ProxyArgs(e), "--cache-components", world.HollowComponents)
	w.StartEdge(t, e, edgeArgs...)

	k := w.StartHollowKubelet(t, e, false)
	// Pods bound before the kubelet posted the node's capacity would be
	// refused (OutOfpods), as with any kubelet.
	testenv.Eventually(t, "the kubelet reports "+e.Name+" Ready", func() bool { return nodeReady(t, ctx, admin, e.Name) })
	const pods = 6
	uids, err := world.CreateWorkload(ctx, admin, w.CP.CA.CertPEM, world.WorkloadOptions{Namespace: "shop", Node: e.Name, Pods: pods, LocalVolume: true})
	if err != nil {
		t.Fatal(err)
	}
	waitPodsRunning(t, ctx, admin, "shop", uids)
	waitKubeletRuns(t, ctx, k, "shop", uids)
	t.Logf("online: %d pods Running on %s", len(uids), e.Name)

	// The power cut: the uplink is down, and the node goes down with
	// everything on it.
	e.CutUplink(t)
	if err := k.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := w.Kill(e.Host); err != nil {
		t.Logf("tether-edge killed: %v", err)
	}
	w.StartEdge(t, e, edgeArgs...)
	started := time.Now()
	k = w.StartHollowKubelet(t, e, false)
	waitKubeletRuns(t, ctx, k, "shop", uids)
	t.Logf("offline restart: all %d pods run again %v after the kubelet started", len(uids), time.Since(started).Round(100*time.Millisecond))

	// The outage lasts long enough for kube-controller-manager to mark
	// the node Unknown, as any real one does.
	testenv.Eventually(t, "kube-controller-manager marks "+e.Name+" not Ready", func() bool {
		return !nodeReady(t, ctx, admin, e.Name)
	})
	if k.Exited() {
		t.Fatalf("the kubelet exited offline:\n%s", tailLines(k.Log(), 40))
	}

	e.HealUplink(t)
	healed := time.Now()
	testenv.Eventually(t, e.Name+" Ready again after the heal", func() bool { return nodeReady(t, ctx, admin, e.Name) })
	t.Logf("heal: %s Ready %v after the uplink came back", e.Name, time.Since(healed).Round(100*time.Millisecond))
	testenv.EventuallyNoError(t, "a Lease renewed after the heal", func() error {
		l, err := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, e.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if l.Spec.RenewTime == nil || l.Spec.RenewTime.Time.Before(healed.Add(-time.Second)) {
			return fmt.Errorf("lease renewed at %v, before the heal at %v", l.Spec.RenewTime, healed)
		}
		return nil
	})

	// Nothing lost or repeated: the same pods, never deleted or made
	// again, and every status write made offline accounted for.
	waitPodsRunning(t, ctx, admin, "shop", uids)
	list, err := admin.CoreV1().Pods("shop").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != len(uids) {
		t.Errorf("%d pods in shop after the heal, want the %d made before the outage", len(list.Items), len(uids))
	}
	for _, p := range list.Items {
		if p.DeletionTimestamp != nil || uids[p.Name] != p.UID {
			t.Errorf("pod %s after the heal: uid %s (was %s), deletion %v", p.Name, p.UID, uids[p.Name], p.DeletionTimestamp)
		}
	}
	waitLedgerDrained(t, ctx, e)
}

// waitLedgerDrained waits until e has replayed every status write queued
// offline (there were some) and its ledger balances.
func waitLedgerDrained(t *testing.T, ctx context.Context, e *world.Edge) {
	t.Helper()
	testenv.EventuallyNoError(t, "the offline status writes replayed and the ledger balanced", func() error {
		l, err := e.QueueLedger(ctx)
		if err != nil {
			return err
		}
		if !l.Balanced || l.Queued != 0 || l.Enqueued == 0 {
			return fmt.Errorf("ledger %+v", l)
		}
		return nil
	})
}

// waitPodsRunning waits until the cloud sees every pod Running under its UID.
func waitPodsRunning(t *testing.T, ctx context.Context, c kubernetes.Interface, ns string, uids map[string]types.UID) {
	t.Helper()
	testenv.EventuallyNoError(t, fmt.Sprintf("%d pods Running in %s", len(uids), ns), func() error {
		list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		running := 0
		for _, p := range list.Items {
			if uids[p.Name] == p.UID && p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		if running != len(uids) {
			return fmt.Errorf("%d of %d Running", running, len(uids))
		}
		return nil
	})
}

// waitKubeletRuns waits until the kubelet's runtime runs every pod, by
// name and UID.
func waitKubeletRuns(t *testing.T, ctx context.Context, k *world.HollowKubelet, ns string, uids map[string]types.UID) {
	t.Helper()
	testenv.EventuallyNoError(t, fmt.Sprintf("the kubelet of %s runs %d pods", k.Edge.Name, len(uids)), func() error {
		if k.Exited() {
			t.Fatalf("the kubelet of %s exited:\n%s", k.Edge.Name, tailLines(k.Log(), 40))
		}
		running, err := k.RunningPods(ctx)
		if err != nil {
			return err
		}
		var missing []string
		for name, uid := range uids {
			if running[ns+"/"+name] != uid {
				missing = append(missing, name)
			}
		}
		if len(missing) > 0 {
			slices.Sort(missing)
			return fmt.Errorf("not running: %v (running: %v)", missing, slices.Sorted(maps.Keys(running)))
		}
		return nil
	})
}

// tailLines is the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
