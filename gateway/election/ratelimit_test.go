package election

import (
	"context"
	"encoding/json"
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

// TestRateLimited: a member that keeps writing records it may not (naming
// another holder) is refused Limit.Burst times, then answered
// rate_limited without a request to the apiserver (the fake clientset's
// actions), even for a write it may make; another member is served
// meanwhile. After the window it is served again.
func TestRateLimited(t *testing.T) {
	ctx := context.Background()
	clk := testclock.NewFakePassiveClock(t0)
	node := func(name string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{openyurt.PoolLabel: "shop"}}}
	}
	released := electionRecord("shop", "", record.Election{})
	client := fake.NewSimpleClientset(node("edge-1"), node("edge-2"), released)
	logs := &testenv.LogBuffer{}
	h, err := New(Options{Client: client, Nodes: poolcheck.APINodes{Client: client}, Clock: clk,
		Limit: poolcheck.Limit{Burst: 3, Per: time.Minute}, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	send := func(sender, holder string) tunnel.ElectionReply {
		t.Helper()
		b, err := json.Marshal(electionRecord("shop", "1", held(holder, t0)))
		if err != nil {
			t.Fatal(err)
		}
		return h.Elect(ctx, sender, tunnel.ElectionRequest{Op: tunnel.ElectionUpdate, Record: tunnel.RecordElection, Pool: "shop", ConfigMap: b})
	}

	for i := range 3 {
		if rep := send("edge-2", "edge-1"); rep.Code != tunnel.NotHolder {
			t.Fatalf("request %d: %+v, want not_holder", i+1, rep)
		}
	}
	actions := len(client.Actions())
	for range 4 {
		if rep := send("edge-2", "edge-2"); rep.Code != tunnel.RateLimited || !strings.Contains(rep.Message, "next request in 20s") {
			t.Fatalf("while limited: %+v, want rate_limited", rep)
		}
	}
	if got := client.Actions()[actions:]; len(got) != 0 {
		t.Errorf("rate-limited requests made %d apiserver requests, want 0: %v", len(got), got)
	}
	v, err := metrictest.Value(h.results, "tether_gateway_election_writes_total", "result=rate_limited")
	if err != nil || v != 4 {
		t.Errorf("rate_limited counted %v (%v), want 4", v, err)
	}
	if n := strings.Count(logs.String(), "sender refused too often"); n != 1 {
		t.Errorf("logged the limit %d times, want once:\n%s", n, logs)
	}
	if rep := send("edge-1", "edge-1"); rep.Code != tunnel.OK {
		t.Errorf("edge-1 while edge-2 is limited: %+v, want ok", rep)
	}

	clk.SetTime(t0.Add(time.Minute))
	if rep := send("edge-2", "edge-2"); rep.Code != tunnel.OK {
		t.Fatalf("after the window: %+v, want ok", rep)
	}
	cm, err := client.CoreV1().ConfigMaps(record.Namespace).Get(ctx, record.ElectionName("shop"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := record.DecodeElection(cm); err != nil || rec.HolderIdentity != "edge-2" {
		t.Errorf("record after the window: %+v, %v; want held by edge-2", rec, err)
	}
}
