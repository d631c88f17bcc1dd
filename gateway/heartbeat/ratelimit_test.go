package heartbeat

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	testclock "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/gateway/internal/metrictest"
	"github.com/tether-edge/tether/gateway/poolcheck"
	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/tunnel"
)

// TestRateLimited: a member that keeps asking for delegated heartbeats it
// may not send is refused Limit.Burst times, then answered rate_limited
// without a request to the apiserver (the fake clientset's actions), even
// once it may; the leader is served meanwhile. After the window it is
// served again.
func TestRateLimited(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := testclock.NewFakePassiveClock(t0)
	node := func(name string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{openyurt.PoolLabel: "pool-a"}}}
	}
	electionCM := func(holder string) *corev1.ConfigMap {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record.ElectionName("pool-a"), Namespace: record.Namespace}}
		if err := record.SetElection(cm, record.Election{HolderIdentity: holder, LeaseDurationSeconds: 3600,
			AcquireTime: metav1.NewTime(t0), RenewTime: metav1.NewTime(t0)}); err != nil {
			t.Fatal(err)
		}
		return cm
	}
	client := fake.NewSimpleClientset(node("leader"), node("member"), node("member-2"), electionCM("leader"))
	logs := &testenv.LogBuffer{}
	h, err := New(Options{Client: client, Clock: clk, Limit: poolcheck.Limit{Burst: 3, Per: time.Minute}, MaxLease: time.Hour,
		Logger: slog.New(slog.NewTextHandler(logs, nil)), Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	send := func(sender string) tunnel.Reply {
		t.Helper()
		return h.Delegate(ctx, sender, tunnel.DelegateRequest{Node: "member-2", Lease: leaseJSON(t, "", "member-2", t0)})
	}
	count := func(code tunnel.Code) float64 {
		t.Helper()
		v, err := metrictest.Value(h.results, "tether_gateway_delegated_heartbeats_total", "result="+code.String())
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	for i := range 3 {
		if rep := send("member"); rep.Code != tunnel.NotLeader {
			t.Fatalf("request %d: %+v, want not_leader", i+1, rep)
		}
	}
	// member may send now, but is not looked at.
	if _, err := client.CoreV1().ConfigMaps(record.Namespace).Update(ctx, electionCM("member"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	actions := len(client.Actions())
	for range 5 {
		if rep := send("member"); rep.Code != tunnel.RateLimited || !strings.Contains(rep.Message, "next request in 20s") {
			t.Fatalf("while limited: %+v, want rate_limited", rep)
		}
	}
	if got := client.Actions()[actions:]; len(got) != 0 {
		t.Errorf("rate-limited requests made %d apiserver requests, want 0: %v", len(got), got)
	}
	if got := count(tunnel.RateLimited); got != 5 {
		t.Errorf("rate_limited counted %v, want 5", got)
	}
	if n := strings.Count(logs.String(), "sender refused too often"); n != 1 {
		t.Errorf("logged the limit %d times, want once:\n%s", n, logs)
	}
	// Another sender is not limited (its refusal, not_leader, reads the
	// apiserver as before).
	if rep := send("leader"); rep.Code != tunnel.NotLeader {
		t.Errorf("leader: %+v, want not_leader (member holds the record now)", rep)
	}

	clk.SetTime(t0.Add(time.Minute))
	if rep := send("member"); rep.Code != tunnel.OK {
		t.Fatalf("after the window: %+v, want ok", rep)
	}
	if _, err := client.CoordinationV1().Leases(corev1.NamespaceNodeLease).Get(ctx, "member-2", metav1.GetOptions{}); err != nil {
		t.Errorf("member-2's Lease after the window: %v", err)
	}
}
