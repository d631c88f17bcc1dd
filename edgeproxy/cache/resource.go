package cache

import (
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/internal/localapi"
)

// Scope is what a list or watch covers: a namespace and label and field
// selectors (localapi.Scope, which the pool replica serves with too).
// Objects read from records carry their indexed fields
// (localapi.Object.Indexed), so that Matches decodes no JSON for them.
type Scope = localapi.Scope

// indexedFields are, per kind, the fields a record's meta section holds:
// those kube-apiserver supports in field selectors for the kinds node
// components read. Other fields are read from the object's JSON.
var indexedFields = map[string][]string{
	"Pod": {"spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
		"spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName"},
	"Secret":    {"type"},
	"Node":      {"spec.unschedulable"},
	"Service":   {"spec.clusterIP", "spec.type"},
	"Namespace": {"status.phase"},
	"Event": {"involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
		"involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath",
		"reason", "reportingComponent", "source", "type"},
}

// indexFields returns the values of the object's indexed fields.
func indexFields(o *localapi.Object) map[string]string {
	return o.FieldValues(indexedFields[o.Kind])
}

// ResourceInfo is what the cache knows of one resource of one component.
type ResourceInfo struct {
	// Kind and APIVersion of its objects ("Pod", "v1").
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	// MaxRV is the largest resourceVersion seen for the resource.
	MaxRV uint64 `json:"maxRV"`
	// Updated is when the cache last changed the resource (objects,
	// lists, deletions, bookmarks), in Unix seconds, to the minute: the
	// least recently updated resources are evicted first. 0 in files of
	// older versions.
	Updated int64 `json:"updated,omitempty"`
}

// resourceKey names a resource's bucket: group/version/resource, with
// "core" for the legacy group.
func resourceKey(gvr schema.GroupVersionResource) []byte {
	g := gvr.Group
	if g == "" {
		g = "core"
	}
	return []byte(g + "/" + gvr.Version + "/" + gvr.Resource)
}
