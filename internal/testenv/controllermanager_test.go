package testenv

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// TestControllerManagerNodeLifecycle runs the real node lifecycle
// controller: a node whose Lease is renewed every second stays Ready past
// the grace period, and one whose Lease stops turns Ready=Unknown once the
// grace period has passed (a busy machine may make it later).
func TestControllerManagerNodeLifecycle(t *testing.T) {
	cp := StartControlPlane(t, ControlPlaneOptions{})
	cm := cp.StartControllerManager(t, ControllerManagerOptions{})
	grace := cm.Options.NodeMonitorGracePeriod
	// The controller notices within a monitor period of the grace period
	// ending on an idle machine; the bound is for one that never does.
	const slack = 60 * time.Second

	ctx, cancel := context.WithTimeout(context.Background(), grace+slack+30*time.Second)
	defer cancel()
	ensureNamespace(ctx, t, cp.Client, corev1.NamespaceNodeLease)
	alive := startHeartbeat(ctx, t, cp, "edge-alive")
	startHeartbeat(ctx, t, cp, "edge-silent")
	start := time.Now()

	renewed := make(chan struct{})
	go func() {
		defer close(renewed)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				if err := renewLease(ctx, alive, "edge-alive"); err != nil && ctx.Err() == nil {
					t.Errorf("renew Lease of edge-alive: %v", err)
					return
				}
			}
		}
	}()
	defer func() { cancel(); <-renewed }()

	// edge-silent: Unknown, but not before the grace period has passed
	// since its Lease was last renewed (when it was created).
	var silentAfter time.Duration
	EventuallyWithin(t, grace+slack, "edge-silent Ready=Unknown after its Lease stopped", func() bool {
		silentAfter = time.Since(start)
		return readyCondition(ctx, t, cp.Client, "edge-silent").Status == corev1.ConditionUnknown
	})
	if silentAfter < grace {
		t.Errorf("edge-silent turned Ready=Unknown after %v, before the grace period of %v", silentAfter, grace)
	}
	t.Logf("edge-silent: Ready=Unknown after %v", silentAfter.Round(100*time.Millisecond))

	// edge-alive: Ready all along, through a later judgement too. ghost,
	// a node whose Lease is created now and never renewed, turns Unknown
	// only once the controller has judged a heartbeat newer than any of
	// edge-silent's past the grace period: by then edge-alive, renewed
	// every second, has been judged in the same passes.
	startHeartbeat(ctx, t, cp, "ghost")
	Never(t, "edge-alive, its Lease renewed every second, left Ready=True",
		func() bool { return readyCondition(ctx, t, cp.Client, "edge-alive").Status != corev1.ConditionTrue },
		func() bool { return readyCondition(ctx, t, cp.Client, "ghost").Status == corev1.ConditionUnknown })
}

// startHeartbeat creates Node name, then, as that node (like a kubelet),
// posts Ready=True and creates its Lease. It returns the node's client.
func startHeartbeat(ctx context.Context, t *testing.T, cp *ControlPlane, name string) kubernetes.Interface {
	t.Helper()
	createNode(ctx, t, cp.Client, name, map[string]string{edgeLabel: "true"})
	client, _, _ := cp.NodeClient(t, name)
	// A patch of the status, as the kubelet sends: an update would carry
	// the taints of the Node read before it, and the controller may have
	// tainted the new Node since (NodeRestriction forbids a node to change
	// its taints).
	now := metav1.Now()
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{{
		Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
		LastHeartbeatTime: now, LastTransitionTime: now,
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().PatchStatus(ctx, name, patch); err != nil {
		t.Fatalf("node %s posting Ready=True: %v", name, err)
	}
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       ptr.To(name),
			LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime:            &metav1.MicroTime{Time: time.Now()},
		},
	}
	if _, err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Fatalf("node %s creating its Lease: %v", name, err)
	}
	return client
}

func renewLease(ctx context.Context, client kubernetes.Interface, name string) error {
	leases := client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	lease, err := leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	lease.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}

// readyCondition returns the Node's Ready condition (Status "" if none).
func readyCondition(ctx context.Context, t *testing.T, c kubernetes.Interface, name string) corev1.NodeCondition {
	t.Helper()
	node, err := c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node %s: %v", name, err)
	}
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond
		}
	}
	return corev1.NodeCondition{Type: corev1.NodeReady}
}

// ensureNamespace creates ns unless it exists: the apiserver creates the
// system namespaces shortly after it is ready, not before.
func ensureNamespace(ctx context.Context, t *testing.T, c kubernetes.Interface, ns string) {
	t.Helper()
	_, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
}
