package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/ptr"

	"github.com/tether-edge/tether/gateway/pooltaint"
	"github.com/tether-edge/tether/internal/kube"
	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/elect"
	"github.com/tether-edge/tether/poolstore/record"
)

// TestPoolsFromCloud runs `tetherctl pools` against a real kube-apiserver
// with the shipped RBAC: pool shop elects edge-1 through poolstore's own
// election (edge-1's node identity reads the record, an administrator
// writes it as the gateway does for edges) and has a sync record, delegated
// Leases and a taint; pool yard has an expired election record, pool lab
// none. The gateway's identity reads it all; a user without RBAC is told
// what is missing.
func TestPoolsFromCloud(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const manifests = "../../packaging/kubernetes/"
	if err := testenv.ApplyManifests(ctx, cp.Admin, false,
		manifests+"edge-rbac.yaml", manifests+"pool-rbac.yaml", manifests+"gateway-rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	admin := cp.Client

	for node, pool := range map[string]string{"edge-1": "shop", "edge-2": "shop", "edge-3": "shop", "lab-1": "lab", "yard-1": "yard", "cloud-1": ""} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node, Labels: map[string]string{}}}
		if pool != "" {
			n.Labels[openyurt.PoolLabel] = pool
		}
		if node == "edge-3" {
			n.Spec.Taints = []corev1.Taint{pooltaint.Taint}
		}
		if _, err := admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The node Leases: edge-2's and edge-3's as the gateway writes them for
	// a node that lost the cloud, edge-1's as its kubelet does.
	for node, delegated := range map[string]bool{"edge-1": false, "edge-2": true, "edge-3": true} {
		l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node},
			Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To(node), LeaseDurationSeconds: ptr.To[int32](40),
				RenewTime: &metav1.MicroTime{Time: time.Now()}}}
		if delegated {
			l.Annotations = map[string]string{openyurt.DelegateHeartbeatAnnotation: "true"}
		}
		if _, err := admin.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, l, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// shop's election, as tether-edge runs it (the gateway's writes stood
	// for by an administrator's).
	_, nodeConfig, _ := cp.NodeClient(t, "edge-1")
	nodeClient, err := kube.NewForConfig(nodeConfig)
	if err != nil {
		t.Fatal(err)
	}
	adminKube, err := kube.NewForConfig(cp.Admin)
	if err != nil {
		t.Fatal(err)
	}
	el, err := elect.New(elect.Options{Client: nodeClient, Pool: "shop", Node: "edge-1",
		Records: record.ClientWriter{ConfigMaps: adminKube.ConfigMaps(record.Namespace)}})
	if err != nil {
		t.Fatal(err)
	}
	ectx, ecancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		el.Run(ectx, func(ctx context.Context) { <-ctx.Done() })
	}()
	defer func() { ecancel(); <-done }()
	for {
		if _, leading := el.Leader(); leading {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("edge-1 never led shop")
		case <-time.After(20 * time.Millisecond):
		}
	}
	// shop's sync record as poolstore writes it, and yard's expired
	// election record as client-go's leader election wrote it (tether-edge
	// before its own elector; the format is the same).
	synced := time.Now().Add(-2 * time.Second)
	yardRenewed := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	rec, _ := json.Marshal(resourcelock.LeaderElectionRecord{HolderIdentity: "yard-1", LeaseDurationSeconds: 15,
		AcquireTime: yardRenewed, RenewTime: yardRenewed})
	for _, cm := range []*corev1.ConfigMap{
		{ObjectMeta: metav1.ObjectMeta{Name: record.SyncName("shop")}, Data: map[string]string{
			"holderIdentity": "edge-1", "renewTime": synced.UTC().Format(time.RFC3339Nano), "leaseDurationSeconds": "30"}},
		{ObjectMeta: metav1.ObjectMeta{Name: record.ElectionName("yard"),
			Annotations: map[string]string{resourcelock.LeaderElectionRecordAnnotationKey: string(rec)}}},
	} {
		if _, err := admin.CoreV1().ConfigMaps(record.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("table", func(t *testing.T) {
		code, out, errOut := runCtl("pools", "--kubeconfig", cp.AdminKubeconfig)
		if code != exitOK || errOut != "" {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
		t.Logf("tetherctl pools:\n%s", out)
		want := [][]string{
			{"POOL", "MEMBERS", "LEADER", "RENEWED", "LAST SYNC", "DELEGATED", "TAINTED"},
			{"lab", "1", "none", "-", "-", "-", "-"},
			{"shop", "3", "edge-1", "AGE ago", "AGE ago", "edge-2,edge-3", "edge-3"},
			{"yard", "1", "yard-1 (expired)", "AGE ago", "-", "-", "-"},
		}
		if d := cmp.Diff(want, cells(maskAges(out))); d != "" {
			t.Errorf("table (-want +got):\n%s", d)
		}
		if !strings.Contains(out, " 1h0m0s ago ") && !strings.Contains(out, " 1h0m1s ago ") {
			t.Errorf("yard's leader renewed an hour ago:\n%s", out)
		}

		code, out, _ = runCtl("pools", "-o", "wide", "--kubeconfig", cp.AdminKubeconfig)
		rows := cells(out)
		if code != exitOK || len(rows) != 4 || rows[0][7] != "NODES" || rows[2][7] != "edge-1,edge-2,edge-3" {
			t.Errorf("-o wide: exit %d, want the members' names:\n%s", code, out)
		}
	})

	// The gateway's identity (gateway-rbac.yaml), from $KUBECONFIG.
	gwCert, err := cp.CA.ClientCert("tether-gateway")
	if err != nil {
		t.Fatal(err)
	}
	t.Run("json as the gateway", func(t *testing.T) {
		t.Setenv("KUBECONFIG", cp.Kubeconfig(t, "tether-gateway", gwCert))
		start := time.Now()
		code, out, errOut := runCtl("pools", "-o", "json")
		if code != exitOK {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		var got []cloudPool
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("output is not JSON: %v\n%s", err, out)
		}
		if len(got) != 3 {
			t.Fatalf("want pools lab, shop, yard:\n%s", out)
		}
		shop := got[1]
		if e := shop.Election; e == nil || e.Holder != "edge-1" || e.Expired || time.Since(e.Renewed) > time.Minute || !e.Expires.After(start) {
			t.Errorf("shop's election: %+v, want held by edge-1, renewed just now", e)
		}
		if s := shop.Sync; s == nil || s.Holder != "edge-1" || !s.Renewed.Equal(synced) || s.Expired || !s.Expires.Equal(synced.Add(30*time.Second)) {
			t.Errorf("shop's sync record: %+v, want edge-1's at %v", s, synced)
		}
		if e := got[2].Election; e == nil || e.Holder != "yard-1" || !e.Expired || !e.Renewed.Equal(yardRenewed.Time) {
			t.Errorf("yard's election: %+v, want yard-1's, expired", e)
		}
		got[1].Election, got[1].Sync, got[2].Election = nil, nil, nil
		want := []cloudPool{
			{Pool: "lab", Members: []string{"lab-1"}, Delegated: []string{}, Tainted: []string{}},
			{Pool: "shop", Members: []string{"edge-1", "edge-2", "edge-3"}, Delegated: []string{"edge-2", "edge-3"}, Tainted: []string{"edge-3"}},
			{Pool: "yard", Members: []string{"yard-1"}, Delegated: []string{}, Tainted: []string{}},
		}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("-o json (-want +got):\n%s", d)
		}
	})

	t.Run("forbidden", func(t *testing.T) {
		nobody, err := cp.CA.ClientCert("nobody")
		if err != nil {
			t.Fatal(err)
		}
		code, out, errOut := runCtl("pools", "--kubeconfig", cp.Kubeconfig(t, "nobody", nobody))
		if code != exitError || out != "" {
			t.Errorf("exit %d, stdout %q; want %d and nothing", code, out, exitError)
		}
		for _, want := range []string{"tetherctl pools: list nodes:", `User "nobody" cannot list resource "nodes"`,
			"list on nodes, list on leases in kube-node-lease and get on configmaps in tether-system", "gateway-rbac.yaml"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("stderr %q lacks %q", errOut, want)
			}
		}
	})

	// Stopping the leader releases the record: shop has no leader.
	ecancel()
	<-done
	code, out, _ := runCtl("pools", "--kubeconfig", cp.AdminKubeconfig)
	if rows := cells(out); code != exitOK || len(rows) != 4 || rows[2][2] != "none" {
		t.Errorf("after the leader released shop: exit %d, want leader none:\n%s", code, out)
	}
}
