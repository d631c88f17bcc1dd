package poolcheck

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/poolstore/record"
	"github.com/tether-edge/tether/tunnel"
)

// memPools is an in-memory NodePools: node → pool ("" for a Node without
// the label); a node not in it has no Node. err, if set, is every answer.
type memPools struct {
	pools map[string]string
	err   error
}

var _ NodePools = memPools{}

func (m memPools) NodePool(_ context.Context, node string) (string, bool, error) {
	if m.err != nil {
		return "", false, m.err
	}
	pool, ok := m.pools[node]
	return pool, ok, nil
}

// memRecords is an in-memory record.ConfigMapGetter: name → ConfigMap.
// err, if set, is every answer.
type memRecords struct {
	cms map[string]*corev1.ConfigMap
	err error
}

var _ record.ConfigMapGetter = memRecords{}

func (m memRecords) Get(_ context.Context, name string, _ metav1.GetOptions) (*corev1.ConfigMap, error) {
	if m.err != nil {
		return nil, m.err
	}
	cm, ok := m.cms[name]
	if !ok {
		return nil, apierrors.NewNotFound(corev1.Resource("configmaps"), name)
	}
	return cm.DeepCopy(), nil
}

// electionRecord is pool's election record held by holder, renewed at
// renew, of 15 s.
func electionRecord(t *testing.T, pool, holder string, renew time.Time) *corev1.ConfigMap {
	t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record.ElectionName(pool), Namespace: record.Namespace}}
	rec := record.Election{HolderIdentity: holder, LeaseDurationSeconds: 15,
		AcquireTime: metav1.NewTime(renew), RenewTime: metav1.NewTime(renew)}
	if err := record.SetElection(cm, rec); err != nil {
		t.Fatal(err)
	}
	return cm
}

var pools = memPools{pools: map[string]string{"edge-1": "shop", "edge-2": "shop", "yard-1": "yard", "loner": ""}}

func TestPoolOf(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		nodes      NodePools
		node, role string
		want       string
		code       tunnel.Code // OK: no refusal
		msg        string
	}{
		{pools, "edge-1", "sender", "shop", tunnel.OK, ""},
		{pools, "ghost", "sender", "", tunnel.UnknownNode, "sender ghost has no Node"},
		{pools, "ghost", "", "", tunnel.UnknownNode, "ghost has no Node"},
		{pools, "loner", "delegated node", "", tunnel.NotInPool, "delegated node loner has no " + openyurt.PoolLabel + " label"},
		{memPools{err: errors.New("not synced")}, "edge-1", "sender", "", tunnel.Unavailable, "pool of sender edge-1: not synced"},
	} {
		got, err := Checker{Nodes: tc.nodes}.PoolOf(ctx, tc.node, tc.role)
		checkRefusal(t, fmt.Sprintf("PoolOf(%s, %q)", tc.node, tc.role), err, tc.code, tc.msg)
		if got != tc.want {
			t.Errorf("PoolOf(%s, %q) = %q, want %q", tc.node, tc.role, got, tc.want)
		}
	}
}

func TestMember(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		node, pool string
		code       tunnel.Code
		msg        string
	}{
		{"edge-1", "shop", tunnel.OK, ""},
		{"yard-1", "shop", tunnel.OtherPool, `yard-1 is in pool "yard", not "shop"`},
		{"loner", "shop", tunnel.NotInPool, "loner has no " + openyurt.PoolLabel + " label"},
		{"ghost", "shop", tunnel.UnknownNode, "ghost has no Node"},
	} {
		err := Checker{Nodes: pools}.Member(ctx, tc.node, tc.pool)
		checkRefusal(t, fmt.Sprintf("Member(%s, %s)", tc.node, tc.pool), err, tc.code, tc.msg)
	}
}

func TestLeader(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	records := memRecords{cms: map[string]*corev1.ConfigMap{
		record.ElectionName("shop"): electionRecord(t, "shop", "edge-1", t0),
		record.ElectionName("yard"): electionRecord(t, "yard", "", t0), // released
	}}
	ref := record.Namespace + "/" + record.ElectionName("shop")
	for _, tc := range []struct {
		name         string
		records      memRecords
		sender, pool string
		now          time.Time
		code         tunnel.Code
		msg          string
	}{
		{"holder, in its term", records, "edge-1", "shop", t0.Add(14 * time.Second), tunnel.OK, ""},
		{"another node", records, "edge-2", "shop", t0, tunnel.NotLeader,
			"pool shop is led by edge-1, not edge-2 (election record " + ref + ")"},
		{"holder, at expiry", records, "edge-1", "shop", t0.Add(15 * time.Second), tunnel.LeaderExpired,
			"election record " + ref + " expired at 2025-03-01T12:00:15Z (now 2025-03-01T12:00:15Z)"},
		{"no record", records, "edge-1", "depot", t0, tunnel.NotLeader,
			"pool depot has no leader (election record " + record.Namespace + "/" + record.ElectionName("depot") + ")"},
		{"released record", records, "yard-1", "yard", t0, tunnel.NotLeader,
			"pool yard has no leader (election record " + record.Namespace + "/" + record.ElectionName("yard") + ")"},
		{"apiserver error", memRecords{err: errors.New("connection refused")}, "edge-1", "shop", t0, tunnel.Unavailable,
			"read election record " + ref + ": connection refused"},
	} {
		err := Checker{Records: tc.records}.Leader(ctx, tc.sender, tc.pool, tc.now)
		checkRefusal(t, tc.name, err, tc.code, tc.msg)
	}
}

func TestAsRefusal(t *testing.T) {
	if r := AsRefusal(nil); r != nil {
		t.Errorf("AsRefusal(nil) = %v, want nil", r)
	}
	want := Refuse(tunnel.OtherPool, "pool %s", "shop")
	if r := AsRefusal(fmt.Errorf("wrapped: %w", want)); r != want {
		t.Errorf("AsRefusal of a wrapped refusal = %v, want %v", r, want)
	}
	r := AsRefusal(errors.New("etcd is down"))
	if r == nil || r.Code != tunnel.Unavailable || r.Msg != "etcd is down" {
		t.Errorf("AsRefusal of an apiserver error = %+v, want unavailable with its message", r)
	}
	if got := want.Error(); got != tunnel.OtherPool.String()+": pool shop" {
		t.Errorf("Error() = %q", got)
	}
}

// checkRefusal fails unless err is a Refusal of code with msg, or nil
// when code is tunnel.OK.
func checkRefusal(t *testing.T, what string, err error, code tunnel.Code, msg string) {
	t.Helper()
	if code == tunnel.OK {
		if err != nil {
			t.Errorf("%s: %v, want no refusal", what, err)
		}
		return
	}
	var r *Refusal
	if !errors.As(err, &r) || r.Code != code || r.Msg != msg {
		t.Errorf("%s: %v, want %v: %s", what, err, code, msg)
	}
}

// TestLeaderLeaseClamped: a holder that wrote a lease far longer than the
// pool's leads for MaxLease (record.DefaultLeaseDuration when unset) after
// its last renewal, and no longer.
func TestLeaderLeaseClamped(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record.ElectionName("shop"), Namespace: record.Namespace}}
	if err := record.SetElection(cm, record.Election{HolderIdentity: "thief", LeaseDurationSeconds: 3000000000,
		AcquireTime: metav1.NewTime(t0), RenewTime: metav1.NewTime(t0)}); err != nil {
		t.Fatal(err)
	}
	records := memRecords{cms: map[string]*corev1.ConfigMap{cm.Name: cm}}
	ref := record.Namespace + "/" + record.ElectionName("shop")
	for _, tc := range []struct {
		name     string
		maxLease time.Duration
		now      time.Time
		code     tunnel.Code
		msg      string
	}{
		{"default, in its term", 0, t0.Add(14 * time.Second), tunnel.OK, ""},
		{"default, at the pool's lease", 0, t0.Add(15 * time.Second), tunnel.LeaderExpired,
			"election record " + ref + " expired at 2025-03-01T12:00:15Z (now 2025-03-01T12:00:15Z)"},
		{"default, a year on", 0, t0.Add(365 * 24 * time.Hour), tunnel.LeaderExpired,
			"election record " + ref + " expired at 2025-03-01T12:00:15Z (now 2026-03-01T12:00:00Z)"},
		{"configured, in its term", 30 * time.Second, t0.Add(29 * time.Second), tunnel.OK, ""},
		{"configured, at the pool's lease", 30 * time.Second, t0.Add(30 * time.Second), tunnel.LeaderExpired,
			"election record " + ref + " expired at 2025-03-01T12:00:30Z (now 2025-03-01T12:00:30Z)"},
	} {
		err := Checker{Records: records, MaxLease: tc.maxLease}.Leader(ctx, "thief", "shop", tc.now)
		checkRefusal(t, tc.name, err, tc.code, tc.msg)
	}
}
