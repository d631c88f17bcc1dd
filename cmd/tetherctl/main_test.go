package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/admin"
	"github.com/tether-edge/tether/internal/statusapi"
)

// serveStatus serves st on the gateway's own admin handler.
func serveStatus(t *testing.T, st statusapi.Gateway) string {
	t.Helper()
	srv := httptest.NewServer(admin.New(admin.Options{Registry: admin.NewRegistry(), Status: func() any { return st }}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func runCtl(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

var since = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

func TestStatusTable(t *testing.T) {
	gw1 := serveStatus(t, statusapi.Gateway{Replica: "gw1", Version: "v1", Mode: "node-ip", Ready: true, EdgeNodes: 3, Edges: []statusapi.ConnectedEdge{
		{Node: "edge-2", Pool: "site-b", ConnectedSince: since, RTTMillis: 12.34, Streams: 2, BytesUp: 1536, BytesDown: 3 << 30},
		{Node: "edge-1", ConnectedSince: since, RTTMillis: 0.5},
	}})
	gw2 := serveStatus(t, statusapi.Gateway{Replica: "gw2", Version: "v1", Mode: "node-ip", NotReady: "nodes not synced", EdgeNodes: 3, Edges: []statusapi.ConnectedEdge{
		{Node: "edge-1", ConnectedSince: since},
	}})
	code, out, errOut := runCtl("status", "--gateway", gw1+","+strings.TrimPrefix(gw2, "http://"))
	if code != 0 || errOut != "" {
		t.Fatalf("exit %d, stderr %q", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 7 {
		t.Fatalf("want 2 gateway lines, a blank, a header and 3 rows; got:\n%s", out)
	}
	if want := "gateway " + gw1 + ": replica gw1, version v1, mode node-ip, ready; 2 of 3 edge nodes connected"; lines[0] != want {
		t.Errorf("line 1 = %q, want %q", lines[0], want)
	}
	if !strings.Contains(lines[1], "replica gw2") || !strings.Contains(lines[1], "NOT READY: nodes not synced") {
		t.Errorf("line 2 = %q", lines[1])
	}
	var got [][]string
	for _, l := range lines[3:] {
		got = append(got, strings.Fields(l))
	}
	// Sorted by node, then replica; the columns: node, pool, replica, RTT,
	// streams, bytes up, bytes down, connected since (time and age).
	want := [][]string{
		{"NODE", "POOL", "REPLICA", "RTT", "STREAMS", "BYTES", "UP", "BYTES", "DOWN", "CONNECTED", "SINCE"},
		{"edge-1", "-", "gw1", "0.50ms", "0", "0", "B", "0", "B", "2026-11-22T10:00:00Z"},
		{"edge-1", "-", "gw2", "-", "0", "0", "B", "0", "B", "2026-11-22T10:00:00Z"},
		{"edge-2", "site-b", "gw1", "12.3ms", "2", "1.5", "KiB", "3.0", "GiB", "2026-11-22T10:00:00Z"},
	}
	for i := 1; i < len(got); i++ {
		got[i] = got[i][:len(got[i])-1] // the age depends on the clock
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("table (-want +got):\n%s\n%s", d, out)
	}
}

func TestStatusJSON(t *testing.T) {
	st := statusapi.Gateway{Replica: "gw1", Ready: true, Edges: []statusapi.ConnectedEdge{{Node: "edge-1", ConnectedSince: since, BytesUp: 7}}}
	gw := serveStatus(t, st)
	code, out, errOut := runCtl("-o", "json", "status", "--gateway", gw)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var got []gatewayStatus
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	want := []gatewayStatus{{URL: gw, Gateway: st}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("-o json (-want +got):\n%s", d)
	}
	if !strings.Contains(out, `"gateway": "`+gw+`"`) || !strings.Contains(out, `"replica": "gw1"`) {
		t.Errorf("want the gateway's own fields inlined next to \"gateway\":\n%s", out)
	}
}

func TestStatusUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there now
	live := serveStatus(t, statusapi.Gateway{Replica: "gw1", Edges: []statusapi.ConnectedEdge{}})

	code, out, errOut := runCtl("status", "--gateway", dead+","+live)
	if code != exitError {
		t.Errorf("exit %d, want %d", code, exitError)
	}
	for _, want := range []string{"gateway http://" + dead + " unreachable", "connection refused", "--admin-listen"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr %q lacks %q", errOut, want)
		}
	}
	if !strings.Contains(out, "replica gw1") || !strings.Contains(out, "no edges connected") {
		t.Errorf("the reachable gateway is still shown; stdout:\n%s", out)
	}
}

func TestStatusNotAGateway(t *testing.T) {
	srv := httptest.NewServer(admin.New(admin.Options{Registry: admin.NewRegistry()})) // no /status
	defer srv.Close()
	code, _, errOut := runCtl("status", "--gateway", srv.URL)
	if code != exitError || !strings.Contains(errOut, "404") {
		t.Errorf("exit %d, stderr %q; want 1 and the 404", code, errOut)
	}
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string
	}{
		{[]string{"status", "-o", "yaml"}, exitUsage, `want table, json or wide`},
		{[]string{"status", "-o", "wide"}, exitUsage, "are for tetherctl pools"},
		{[]string{"status", "--edge", "127.0.0.1"}, exitUsage, "are for tetherctl pools"},
		{[]string{"ca", "--kubeconfig", "x"}, exitUsage, "are for tetherctl pools"},
		{[]string{"pools", "--kubeconfig", "x", "--edge", "127.0.0.1"}, exitUsage, "not both"},
		{[]string{"pools", "shop"}, exitUsage, "unexpected arguments"},
		{[]string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{}, exitUsage, "Usage: tetherctl"},
		{[]string{"status", "extra"}, exitUsage, "unexpected arguments"},
	} {
		code, _, errOut := runCtl(tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.out) {
			t.Errorf("tetherctl %q: exit %d, stderr %q; want %d and %q", tc.args, code, errOut, tc.code, tc.out)
		}
	}
}

// TestStatusAddressRefusals: the addresses a gateway does not route to the
// edge that claims them are listed once per claim, with the replicas that
// refuse it.
func TestStatusAddressRefusals(t *testing.T) {
	refusals := []statusapi.AddressRefusal{
		{Addr: netip.MustParseAddr("10.1.0.11"), Node: "edge-evil", Reason: string(nodewatch.ReasonConflict), Holder: "edge-a1"},
		{Addr: netip.MustParseAddr("10.0.0.5"), Node: "edge-evil", Reason: string(nodewatch.ReasonCloudNode)},
	}
	gw1 := serveStatus(t, statusapi.Gateway{Replica: "gw1", Edges: []statusapi.ConnectedEdge{}, AddressRefusals: refusals})
	gw2 := serveStatus(t, statusapi.Gateway{Replica: "gw2", Edges: []statusapi.ConnectedEdge{}, AddressRefusals: refusals[:1]})
	code, out, errOut := runCtl("status", "--gateway", gw1+","+gw2)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	_, table, ok := strings.Cut(out, "2 address claims not routed")
	if !ok {
		t.Fatalf("no address refusals in:\n%s", out)
	}
	var got [][]string
	for _, l := range strings.Split(strings.TrimSpace(table), "\n")[1:] {
		got = append(got, strings.Fields(l))
	}
	want := [][]string{
		{"ADDRESS", "CLAIMED", "BY", "REASON", "ROUTED", "TO", "REPLICAS"},
		{"10.0.0.5", "edge-evil", "cloud_node", "none", "gw1"},
		{"10.1.0.11", "edge-evil", "conflict", "edge-a1", "gw1,gw2"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("refusals (-want +got):\n%s\n%s", d, out)
	}
}
