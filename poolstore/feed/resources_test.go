package feed_test

import (
	"reflect"
	"testing"

	"github.com/tether-edge/tether/poolstore/feed"
)

func TestParseResources(t *testing.T) {
	got, err := feed.ParseResources(feed.DefaultResourceSpecs)
	if err != nil || !reflect.DeepEqual(got, feed.DefaultResources) {
		t.Errorf("ParseResources(%q) = %v, %v; want DefaultResources", feed.DefaultResourceSpecs, got, err)
	}
	for _, bad := range []string{"services", "/v1", "services/"} {
		if _, err := feed.ParseResources([]string{bad}); err == nil {
			t.Errorf("ParseResources(%q): no error", bad)
		}
	}
	if k := feed.ResourceKey(feed.DefaultResources[2]); k != "core/v1/services" {
		t.Errorf("ResourceKey(services) = %q", k)
	}
}
