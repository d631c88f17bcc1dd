package writequeue

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/tether-edge/tether/edgeproxy/apiproxy/internal/statuspatch"
	"github.com/tether-edge/tether/edgeproxy/cache"
)

// TestRebase makes the patch of a kubelet's queued heartbeat (made
// against a base where Ready is True) on a Node whose conditions
// kube-controller-manager made Unknown since: the conditions the
// kubelet set come back, a transition gets the replay's time, a
// condition the kubelet never wrote stays; with the body, its other
// fields are sent too; nothing to send when upstream already agrees.
func TestRebase(t *testing.T) {
	base := `{"metadata":{"name":"n","resourceVersion":"5"},"status":{"conditions":[
		{"type":"Ready","status":"True","reason":"KubeletReady","lastHeartbeatTime":"2026-01-01T00:00:00Z","lastTransitionTime":"2025-12-31T00:00:00Z"}]}}`
	w := cache.QueuedWrite{Method: http.MethodPatch, ContentType: statuspatch.StrategicMerge, Resource: "nodes", Name: "n",
		Base: []byte(base),
		Body: []byte(`{"status":{"conditions":[{"type":"Ready","lastHeartbeatTime":"2026-01-01T00:01:00Z"}],"nodeInfo":{"bootID":"b2"}}}`)}
	cur := `{"metadata":{"name":"n","resourceVersion":"9"},"status":{"conditions":[
		{"type":"Ready","status":"Unknown","reason":"NodeStatusUnknown","lastHeartbeatTime":"2026-01-01T00:00:00Z","lastTransitionTime":"2026-01-01T00:00:50Z"},
		{"type":"NetworkUnavailable","status":"False","reason":"RouteCreated","lastHeartbeatTime":"2026-01-01T00:00:50Z","lastTransitionTime":"2026-01-01T00:00:50Z"}]}}`
	now := time.Date(2026, 1, 1, 0, 2, 0, 0, time.UTC)
	ready := map[string]any{"type": "Ready", "status": "True", "reason": "KubeletReady",
		"lastHeartbeatTime": "2026-01-01T00:01:00Z", "lastTransitionTime": "2026-01-01T00:02:00Z"}
	for _, tc := range []struct {
		withBody bool
		want     map[string]any
	}{
		{false, map[string]any{"status": map[string]any{"conditions": []any{ready}}}},
		{true, map[string]any{"status": map[string]any{"conditions": []any{ready}, "nodeInfo": map[string]any{"bootID": "b2"}}}},
	} {
		p, err := rebase(w, []byte(cur), now, tc.withBody)
		if err != nil {
			t.Fatalf("withBody %v: %v", tc.withBody, err)
		}
		var got map[string]any
		if err := json.Unmarshal(p, &got); err != nil {
			t.Fatal(err)
		}
		// The merge key order of a strategic merge patch's list.
		delete(got["status"].(map[string]any), "$setElementOrder/conditions")
		if d := cmp.Diff(tc.want, got); d != "" {
			t.Errorf("withBody %v: patch (-want +got):\n%s", tc.withBody, d)
		}
		// Applied upstream, it leaves NetworkUnavailable as it was.
		out, err := statuspatch.Apply(statuspatch.StrategicMerge, []byte(cur), p, "nodes")
		if err != nil {
			t.Fatal(err)
		}
		var n map[string]any
		json.Unmarshal(out, &n)
		if cs := conditions(n); len(cs) != 2 || cs[1]["type"] != "NetworkUnavailable" || cs[1]["status"] != "False" || cs[0]["status"] != "True" {
			t.Errorf("withBody %v: upstream after the patch: %v", tc.withBody, cs)
		}
	}
	// Upstream already has what the kubelet wrote.
	last, err := statuspatch.Apply(w.ContentType, w.Base, w.Body, "nodes")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rebase(w, last, now, true); !errors.Is(err, errNothingToRebase) {
		t.Errorf("rebase on the kubelet's own last word: %v, want errNothingToRebase", err)
	}
}

// TestRebasesOwnNodeOnly: only this node's Node status patches, kept
// with their base, are rebased; never a pod's, another node's, or an
// update.
func TestRebasesOwnNodeOnly(t *testing.T) {
	q := &Queue{node: "n"}
	own := cache.QueuedWrite{Method: http.MethodPatch, ContentType: statuspatch.StrategicMerge, Resource: "nodes", Name: "n", Base: []byte(`{}`)}
	if !q.rebases(own) {
		t.Errorf("own node's status patch not rebased")
	}
	for what, w := range map[string]cache.QueuedWrite{
		"another node": {Method: http.MethodPatch, ContentType: statuspatch.StrategicMerge, Resource: "nodes", Name: "m", Base: []byte(`{}`)},
		"a pod":        {Method: http.MethodPatch, ContentType: statuspatch.StrategicMerge, Resource: "pods", Namespace: "x", Name: "n", Base: []byte(`{}`)},
		"an update":    {Method: http.MethodPut, ContentType: "application/json", Resource: "nodes", Name: "n"},
		"no base":      {Method: http.MethodPatch, ContentType: statuspatch.StrategicMerge, Resource: "nodes", Name: "n"},
	} {
		if q.rebases(w) {
			t.Errorf("%s rebased", what)
		}
	}
	if (&Queue{}).rebases(own) {
		t.Errorf("rebased without a node name")
	}
}
