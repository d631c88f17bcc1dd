package localapi

import (
	"bytes"
	"encoding/json"
	"testing"
)

// podItem is a pod as a list item: no kind or apiVersion.
const podItem = `{"metadata":{"name":"a","namespace":"ns","uid":"uid-a","resourceVersion":"42","labels":{"app":"web"}},"spec":{"nodeName":"edge-1","hostNetwork":true,"priority":7}}`

func TestDecodeObject(t *testing.T) {
	o, err := DecodeObject([]byte(podItem), "Pod", "v1")
	if err != nil {
		t.Fatal(err)
	}
	if o.Kind != "Pod" || o.RV != 42 || o.UID != "uid-a" || o.Labels["app"] != "web" {
		t.Errorf("decoded %+v", o)
	}
	if !bytes.HasPrefix(o.Raw, []byte(`{"kind":"Pod","apiVersion":"v1","metadata":`)) {
		t.Errorf("kind not spliced in: %s", o.Raw)
	}
	again, err := DecodeObject(o.Raw, "", "")
	if err != nil || again.Kind != "Pod" || again.Name != "a" {
		t.Errorf("spliced JSON does not decode: %v %+v", err, again)
	}
	for path, want := range map[string]string{
		"metadata.name": "a", "metadata.namespace": "ns", "spec.nodeName": "edge-1",
		"spec.hostNetwork": "true", "spec.priority": "7", "status.phase": "", "spec.nodeName.x": "",
	} {
		if got := o.Field(path); got != want {
			t.Errorf("Field(%s) = %q, want %q", path, got, want)
		}
	}
	if f := o.FieldValues([]string{"spec.nodeName", "status.phase"}); len(f) != 2 || f["spec.nodeName"] != "edge-1" || f["status.phase"] != "" {
		t.Errorf("FieldValues = %v", f)
	}
	// Indexed fields are answered from the index, not the JSON.
	o.Indexed = map[string]string{"spec.nodeName": "indexed"}
	if got := o.Field("spec.nodeName"); got != "indexed" {
		t.Errorf("Field(spec.nodeName) with an index = %q", got)
	}
	if _, err := DecodeObject([]byte(`{"metadata":{}}`), "", ""); err == nil {
		t.Error("object without a name decoded")
	}
	if _, err := DecodeObject([]byte(`[1]`), "", ""); err == nil {
		t.Error("non-object decoded")
	}
}

func TestParseRV(t *testing.T) {
	for s, want := range map[string]uint64{"": 0, "0": 0, "42": 42, "18446744073709551615": 1<<64 - 1, "x": 0, "-1": 0, "18446744073709551616": 0} {
		if got := ParseRV(s); got != want {
			t.Errorf("ParseRV(%q) = %d, want %d", s, got, want)
		}
	}
}

// WithResourceVersion sets the resourceVersion and, when the object
// lacks them, kind and apiVersion; the rest of the JSON is kept as it is
// (numbers too).
func TestWithResourceVersion(t *testing.T) {
	type meta struct {
		Kind       string `json:"kind"`
		APIVersion string `json:"apiVersion"`
		Metadata   struct {
			Name            string `json:"name"`
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Spec json.RawMessage `json:"spec"`
	}
	for _, tc := range []struct {
		in, kind, wantKind string
	}{
		{podItem, "Pod", "Pod"},
		{podItem, "", ""},
		{`{"kind":"Lease","apiVersion":"coordination.k8s.io/v1","metadata":{"name":"n"},"spec":{}}`, "Pod", "Lease"},
		{`{"kind":null,"metadata":"not an object","spec":{"big":9007199254740993}}`, "Pod", "Pod"},
	} {
		out, err := WithResourceVersion([]byte(tc.in), 43, tc.kind, "v1")
		if err != nil {
			t.Fatalf("%s: %v", tc.in, err)
		}
		var in, got meta
		_ = json.Unmarshal([]byte(tc.in), &in)
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s: %s does not decode: %v", tc.in, out, err)
		}
		if got.Metadata.ResourceVersion != "43" || got.Kind != tc.wantKind || got.Metadata.Name != in.Metadata.Name || !bytes.Equal(got.Spec, in.Spec) {
			t.Errorf("%s, kind %q: %s", tc.in, tc.kind, out)
		}
	}
	for _, bad := range []string{`[1]`, `null`, `{`} {
		if out, err := WithResourceVersion([]byte(bad), 1, "", ""); err == nil {
			t.Errorf("%s: %s", bad, out)
		}
	}
}
