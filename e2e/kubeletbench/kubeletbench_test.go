package main

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-edge/tether/e2e/world"
)

func TestMissingReasons(t *testing.T) {
	log := strings.Join([]string{
		`I1129 01:02:03.000001    42 kubelet.go:100] "SyncLoop ADD" source="api" pods=["shop/till-00","shop/till-01"]`,
		`E1129 01:02:04.000001    42 projected.go:196] Error preparing data for projected volume kube-api-access-abcde for pod shop/till-00: failed to fetch token: 503`,
		`E1129 01:02:04.000002    42 kubelet_pods.go:2193] "failed to read memory cgroup config for the pod" err="not implemented" podName="till-00"`,
		`E1129 01:02:05.000001    42 projected.go:196] Error preparing data for projected volume kube-api-access-fghij for pod shop/till-01: failed to fetch token: 503`,
		`E1129 01:02:06.000001    42 pod_workers.go:1301] "Error syncing pod, skipping" err="unmounted volumes=[kube-api-access-abcde]" pod="shop/till-00" podUID="0f8e6a2c-1b2d-4e5f-8a9b-0c1d2e3f4a5b"`,
		`E1129 01:02:07.000001    42 projected.go:196] Error preparing data for projected volume kube-api-access-zzzzz for pod shop/till-07: failed to fetch token: 503`,
	}, "\n")
	got := missingReasons(log, "shop", []string{"till-00", "till-01"}, 3)
	want := []string{
		"2× Error preparing data for projected volume kube-api-access-* for pod shop/till-NN: failed to fetch token: 503",
		`1× "Error syncing pod, skipping" err="unmounted volumes=[kube-api-access-*]" pod="shop/till-NN" podUID="<uid>"`,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("reasons (-want +got):\n%s", d)
	}
	if got := missingReasons(log, "shop", nil, 3); got != nil {
		t.Errorf("reasons with nothing missing: %v", got)
	}
}

func TestRunResult(t *testing.T) {
	ok := runResult{all: true, took: 6100 * time.Millisecond, ran: 30, pods: 30}
	if ok.String() != "6.1 s" || ok.seconds() != "6.1" {
		t.Errorf("all ran: %q, %q", ok.String(), ok.seconds())
	}
	bad := runResult{took: time.Minute, ran: 4, pods: 30}
	if want := "not all pods ran within 1m0s: 4 of 30"; bad.String() != want || bad.seconds() != "-" {
		t.Errorf("not all ran: %q, %q; want %q, -", bad.String(), bad.seconds(), want)
	}
}

func TestCharts(t *testing.T) {
	at := time.Date(2026, 11, 29, 1, 0, 0, 0, time.UTC)
	req := func(kind string, s float64) world.AuditRequest {
		verb, res, _ := strings.Cut(kind, " ")
		return world.AuditRequest{Verb: verb, Resource: res, Received: at.Add(time.Duration(s * float64(time.Second)))}
	}
	r := &results{
		pods:          30,
		steadyWindow:  2 * time.Minute,
		restartWindow: time.Minute,
		steady: map[string][]world.AuditRequest{
			"through":  {req("get /readyz", 1), req("get /readyz", 3), req("update leases", 2)},
			"straight": {req("update leases", 2), req("patch nodes/status", 5)},
		},
		restart: map[string]restart{
			"through":  {at: at, reqs: []world.AuditRequest{req("get pods", 2), req("create nodes", 1)}},
			"straight": {at: at, reqs: []world.AuditRequest{req("create nodes", 0.5)}},
		},
	}
	c := charts(r)
	steady, ok := c["kubelet-steady"]
	if !ok || len(c) != 2 {
		t.Fatalf("charts = %v, want kubelet-steady and kubelet-restart", c)
	}
	if want := []string{"get /readyz", "update leases", "patch nodes/status"}; !cmp.Equal(steady.Groups, want) {
		t.Errorf("steady groups %v, want %v", steady.Groups, want)
	}
	if want := []float64{1, 0.5, 0}; !cmp.Equal(steady.Bars[0].Values, want) {
		t.Errorf("through per minute %v, want %v", steady.Bars[0].Values, want)
	}
	through := c["kubelet-restart"].Lines[0]
	if want := []float64{0, 1, 2, 60}; len(through.Points) != 4 || through.Points[1].X != 1 || through.Points[2].Y != 2 || through.Points[3].X != want[3] {
		t.Errorf("through after the restart: %v, want the requests in time order and the window's end", through.Points)
	}
	for name, ch := range c {
		if _, err := ch.SVG(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
