package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/poolstore/record"
)

// TestPoolsLeaseClamped: an election record written with a lease far
// longer than the pools' counts for the configured lease only: its holder,
// 20 s after its last renewal, is shown expired, and the record is marked
// as over the bound.
func TestPoolsLeaseClamped(t *testing.T) {
	now := time.Now()
	renewed := metav1.NewTime(now.Add(-20 * time.Second).Truncate(time.Second))
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: record.ElectionName("shop"), Namespace: record.Namespace}}
	if err := record.SetElection(cm, record.Election{HolderIdentity: "thief", LeaseDurationSeconds: 3000000000,
		AcquireTime: renewed, RenewTime: renewed}); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "thief", Labels: map[string]string{openyurt.PoolLabel: "shop"}}}
	client := fake.NewSimpleClientset(node, cm)

	for _, tc := range []struct {
		maxLease time.Duration
		expired  bool
		over     int
	}{
		{record.DefaultLeaseDuration, true, 3000000000},
		{time.Minute, false, 3000000000},
	} {
		ps, err := readPools(context.Background(), client, now, tc.maxLease)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps) != 1 || ps[0].Election == nil {
			t.Fatalf("pools %+v; want shop's, with its election record", ps)
		}
		e := ps[0].Election
		if e.Expired != tc.expired || e.LeaseSeconds != tc.over || !e.Expires.Equal(renewed.Add(tc.maxLease)) {
			t.Errorf("with a %v lease: %+v; want expired %v at %v, marked over the bound", tc.maxLease, e, tc.expired, renewed.Add(tc.maxLease))
		}
		var b bytes.Buffer
		writePoolsTable(&b, ps, now, false)
		if !strings.Contains(b.String(), "(lease 3000000000s over the bound)") {
			t.Errorf("with a %v lease, the table does not mark the record:\n%s", tc.maxLease, b.String())
		}
	}
}
