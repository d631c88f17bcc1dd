package main

import (
	"io"
	"os"
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
		`E1129 01:02:04.000003    42 kubelet_pods.go:2198] "failed to read memory cgroup limits for the pod" err="not implemented" podName="till-00"`,
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

func TestReport(t *testing.T) {
	at := time.Date(2026, 11, 29, 1, 0, 0, 0, time.UTC)
	req := func(agent, kind string) world.AuditRequest {
		verb, res, _ := strings.Cut(kind, " ")
		return world.AuditRequest{Verb: verb, Resource: res, Agent: agent, Received: at}
	}
	var th, st []world.AuditRequest
	for range 12 {
		th = append(th, req("hollow-kubelet", "update leases"))
		st = append(st, req("hollow-kubelet", "update leases"))
	}
	for range 60 {
		th = append(th, req("tether-edge", "get /readyz"))
	}
	r := &results{
		pods: 30, steadyWindow: 2 * time.Minute, restartWindow: time.Minute,
		steady: map[string][]world.AuditRequest{"through": th, "straight": st},
		restart: map[string]restart{
			"through":  {run: runResult{all: true, took: 6 * time.Second, ran: 30, pods: 30}, reqs: th},
			"straight": {run: runResult{all: true, took: 6 * time.Second, ran: 30, pods: 30}, reqs: st[:2]},
		},
		offline:        runResult{took: time.Minute, ran: 0, pods: 30, missing: []string{"till-00", "till-01"}, reasons: []string{"2× failed to fetch token"}},
		offlineNoToken: runResult{all: true, took: 6200 * time.Millisecond, ran: 30, pods: 30},
	}
	out := capture(t, func() {
		printReport(options{settle: 30 * time.Second, offlineBound: time.Minute}, r)
		printSummary(r)
	})
	for _, want := range []string{
		"the cache adds no request online: the kubelet's 6.0 requests/min through against 6.0 straight (+0.0): met",
		"tether-edge's own requests as the node (health checks, node pool) 30.0/min: through 36.0, straight 6.0, difference +30.0",
		"an online restart without a storm: the kubelet's 12 requests through against 2 straight in 1m0s (tether-edge's own: 60 more): NOT met",
		"not all pods ran within 1m0s: 0 of 30",
		"      2× failed to fetch token",
		"kubelet: pods=30 steady_rpm_through=36.0 steady_rpm_straight=6.0 steady_rpm_edge_own=30.0 ",
		" offline_run_s=- offline_running=0 offline_run_s_notoken=6.2 offline_running_notoken=30\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

// capture returns what f prints to the standard output.
func capture(t *testing.T, f func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	f()
	os.Stdout = stdout
	w.Close()
	return <-done
}
