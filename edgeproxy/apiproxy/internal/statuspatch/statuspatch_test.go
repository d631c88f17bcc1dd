package statuspatch

import (
	"strings"
	"testing"
)

func TestApplyPatch(t *testing.T) {
	pod := []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","uid":"u1"},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"False"},{"type":"X","status":"True"}]}}`)
	smp := []byte(`{"metadata":{"uid":"u1"},"status":{"conditions":[{"type":"Ready","status":"True"}]}}`)
	out, err := Apply(StrategicMerge, pod, smp, "pods")
	if err != nil {
		t.Fatal(err)
	}
	// Conditions merge by type: Ready changes, X stays.
	if !strings.Contains(string(out), `{"status":"True","type":"Ready"}`) || !strings.Contains(string(out), `"type":"X"`) {
		t.Errorf("strategic merge: %s", out)
	}
	out, err = Apply(JSONMerge, pod, []byte(`{"status":{"phase":"Failed"}}`), "pods")
	if err != nil || !strings.Contains(string(out), `"phase":"Failed"`) {
		t.Errorf("merge patch: %s %v", out, err)
	}
	out, err = Apply(JSONPatch, pod, []byte(`[{"op":"replace","path":"/status/phase","value":"Succeeded"}]`), "pods")
	if err != nil || !strings.Contains(string(out), `"phase":"Succeeded"`) {
		t.Errorf("json patch: %s %v", out, err)
	}
	if _, err := Apply("application/apply-patch+yaml", pod, []byte(`{}`), "pods"); err == nil {
		t.Error("server-side apply applied offline")
	}
	if _, err := Apply(StrategicMerge, pod, smp, "configmaps"); err == nil {
		t.Error("strategic merge of an unknown type applied")
	}
}

// TestBetween makes the patch between two pods and applies it: the
// result is the final pod, resourceVersion aside.
func TestBetween(t *testing.T) {
	base := []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","uid":"u1","resourceVersion":"5"},"status":{"phase":"Pending","conditions":[{"type":"Ready","status":"False"},{"type":"X","status":"True"}]}}`)
	final := []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","uid":"u1","resourceVersion":"9"},"status":{"phase":"Running","conditions":[{"type":"Ready","status":"True"}]}}`)
	for _, ct := range []string{StrategicMerge, JSONMerge + "; charset=utf-8"} {
		if !Diffable(ct) {
			t.Fatalf("%s is not diffable", ct)
		}
		patch, err := Between(ct, base, final, "pods")
		if err != nil {
			t.Fatalf("%s: %v", ct, err)
		}
		if strings.Contains(string(patch), "resourceVersion") {
			t.Errorf("%s: the patch carries a resourceVersion: %s", ct, patch)
		}
		out, err := Apply(ct, base, patch, "pods")
		if err != nil {
			t.Fatalf("%s: apply %s: %v", ct, patch, err)
		}
		if !strings.Contains(string(out), `"phase":"Running"`) || strings.Contains(string(out), `"type":"X"`) {
			t.Errorf("%s: %s applied to the base gives %s", ct, patch, out)
		}
	}
	if Diffable(JSONPatch) {
		t.Error("JSON patches are diffable")
	}
	if _, err := Between(JSONPatch, base, final, "pods"); err == nil {
		t.Error("a JSON patch made as a difference")
	}
	if _, err := Between(StrategicMerge, base, final, "configmaps"); err == nil {
		t.Error("a strategic merge patch of an unknown type made")
	}
}
