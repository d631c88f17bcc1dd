package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/edgeproxy/edgetunnel"
	"github.com/tether-edge/tether/gateway/internal/pooltest"
	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

// TestDelegatedHeartbeat runs the whole gateway, with the identity and
// RBAC of packaging/kubernetes/gateway-rbac.yaml, against a real
// kube-apiserver, and tether-edge's tunnel client over real QUIC: edge-1
// leads pool-a (poolstore's election) and has the Lease of edge-2 written
// through its tunnel; after four such renewals the taint controller taints
// edge-2. A node of another pool is refused, and the refusal reaches the
// edge as its typed error.
func TestDelegatedHeartbeat(t *testing.T) {
	pc := pooltest.Start(t, pooltest.Options{
		Pools: map[string]string{"edge-1": "pool-a", "edge-2": "pool-a", "edge-3": "pool-b"}, Labels: map[string]string{nodewatch.EdgeLabel: "true"}})
	cp, ctx := pc.ControlPlane, pc.Ctx

	// edge-1 leads pool-a.
	stopElection := pc.Elect("pool-a", "edge-1")

	// The gateway, as user tether-gateway.
	cfg, ca := testConfig(t, cp.Kubeconfig(t, "tether-gateway", pc.GatewayCert))
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopGateway := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run(runCtx) }()
	defer func() {
		stopGateway()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	admin := "http://" + g.AdminAddr().String()
	testenv.Eventually(t, "/readyz answers ok", func() bool { return httpGet(t, admin+"/readyz") == "ok\n" })
	testenv.Eventually(t, "the taint controller sees every renewal", g.poolTaint.HasSynced)

	// edge-1's tunnel client.
	edge := startTunnel(t, ctx, g, ca, "edge-1")

	leases := cp.Client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	var renew time.Time
	for i := range 4 {
		prev := renew
		// Each renewal is a later one.
		if renew = time.Now().Truncate(time.Microsecond); !renew.After(prev) {
			renew = prev.Add(time.Microsecond)
		}
		if err := edge.DelegateHeartbeat(ctx, "edge-2", nodeLease(t, "edge-2", renew)); err != nil {
			t.Fatalf("delegated heartbeat %d: %v", i+1, err)
		}
		l, err := leases.Get(ctx, "edge-2", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if l.Annotations[openyurt.DelegateHeartbeatAnnotation] != "true" || !l.Spec.RenewTime.Time.Equal(renew) {
			t.Fatalf("edge-2's Lease after delegated heartbeat %d: %+v", i+1, l)
		}
	}
	testenv.Eventually(t, "edge-2 is tainted", func() bool {
		n, err := cp.Client.CoreV1().Nodes().Get(ctx, "edge-2", metav1.GetOptions{})
		return err == nil && slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
			return t.Key == openyurt.UnschedulableTaintKey && t.Value == "true" && t.Effect == corev1.TaintEffectNoSchedule
		})
	})

	// edge-3 is in pool-b: refused, nothing written.
	err = edge.DelegateHeartbeat(ctx, "edge-3", nodeLease(t, "edge-3", time.Now()))
	var refused *edgetunnel.DelegateRefusedError
	if !errors.As(err, &refused) || refused.Code != tunnel.OtherPool || refused.Node != "edge-3" {
		t.Fatalf("heartbeat for edge-3: %v, want an other_pool refusal", err)
	}
	if _, err := leases.Get(ctx, "edge-3", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("edge-3's Lease: %v, want none written", err)
	}

	// edge-1 stops leading (its record is released): refused, once the
	// gateway's informer has seen the release. Until then a renewal may
	// still be answered OK; this one is older than edge-2's Lease, so an
	// OK writes nothing, which the Lease check below holds to.
	stopElection()
	lateOK := 0
	testenv.Eventually(t, "a heartbeat refused after edge-1 stopped leading", func() bool {
		err = edge.DelegateHeartbeat(ctx, "edge-2", nodeLease(t, "edge-2", renew.Add(-time.Second)))
		if err == nil {
			lateOK++
		}
		return err != nil
	})
	if !errors.As(err, &refused) || refused.Code != tunnel.NotLeader {
		t.Fatalf("heartbeat after edge-1 stopped leading: %v, want a not_leader refusal", err)
	}
	if l, err := leases.Get(ctx, "edge-2", metav1.GetOptions{}); err != nil || !l.Spec.RenewTime.Time.Equal(renew) {
		t.Fatalf("edge-2's Lease changed after the refusal: %v %+v", err, l)
	}

	metrics := httpGet(t, admin+"/metrics")
	for _, want := range []string{
		fmt.Sprintf(`tether_gateway_delegated_heartbeats_total{result="ok"} %d`, 4+lateOK),
		`tether_gateway_delegated_heartbeats_total{result="other_pool"} 1`,
		`tether_gateway_delegated_heartbeats_total{result="not_leader"} 1`,
		fmt.Sprintf(`tether_gateway_tunnel_edge_streams_total{result="served"} %d`, 6+lateOK),
		`tether_gateway_delegated_heartbeat_tainted_nodes 1`,
		`tether_gateway_delegated_heartbeat_taint_changes_total{action="taint",result="ok"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// nodeLease is node's Lease as its kubelet writes it, renewed at renew.
func nodeLease(t *testing.T, node string, renew time.Time) []byte {
	t.Helper()
	b, err := json.Marshal(coordinationv1.Lease{
		TypeMeta:   metav1.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
		ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime: ptr.To(metav1.NewMicroTime(renew))},
	})
	if err != nil {
		t.Fatal(err)
	}
	return b
}
