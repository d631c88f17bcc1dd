package feed

import (
	"cmp"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// DefaultResources are the pool-scope resources a gateway feeds and a pool
// shares by default (--pool-resources on both).
var DefaultResources = []schema.GroupVersionResource{
	discoveryv1.SchemeGroupVersion.WithResource("endpointslices"),
	corev1.SchemeGroupVersion.WithResource("endpoints"),
	corev1.SchemeGroupVersion.WithResource("services"),
}

// DefaultResourceSpecs are DefaultResources as --pool-resources names
// them.
var DefaultResourceSpecs = []string{"endpointslices.discovery.k8s.io/v1", "endpoints/v1", "services/v1"}

// ResourceKey names a resource in statements, in the replica and on the
// wire: "<group>/<version>/<resource>", with "core" for the legacy group.
func ResourceKey(gvr schema.GroupVersionResource) string {
	return cmp.Or(gvr.Group, "core") + "/" + gvr.Version + "/" + gvr.Resource
}

// ParseResources reads --pool-resources: "resource.group/version" each
// (services/v1, endpointslices.discovery.k8s.io/v1).
func ParseResources(specs []string) ([]schema.GroupVersionResource, error) {
	var out []schema.GroupVersionResource
	for _, s := range specs {
		i := strings.LastIndex(s, "/")
		if i <= 0 || i == len(s)-1 {
			return nil, fmt.Errorf("--pool-resources %q: want resource.group/version (services/v1, endpointslices.discovery.k8s.io/v1)", s)
		}
		out = append(out, schema.ParseGroupResource(s[:i]).WithVersion(s[i+1:]))
	}
	return out, nil
}
