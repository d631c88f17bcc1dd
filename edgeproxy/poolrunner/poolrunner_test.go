package poolrunner

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestParseResources(t *testing.T) {
	got, err := ParseResources([]string{"endpointslices.discovery.k8s.io/v1", "services/v1"})
	if err != nil {
		t.Fatal(err)
	}
	want := []schema.GroupVersionResource{
		{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"},
		{Version: "v1", Resource: "services"},
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"services", "/v1", "services/"} {
		if _, err := ParseResources([]string{bad}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
