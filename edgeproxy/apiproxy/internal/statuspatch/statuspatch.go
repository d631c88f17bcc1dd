// Package statuspatch applies and computes the patches of pod and node
// status writes, as kube-apiserver does: the proxy applies a patch made
// offline to the cached object to answer it (Apply), and the write queue
// replaces queued patches by one difference from the same base (Between).
// Both use the same libraries and the same Go types, so that a patch the
// queue computes has upstream the effect the proxy answered.
package statuspatch

import (
	"encoding/json"
	"fmt"
	"mime"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
)

// The patch media types.
const (
	StrategicMerge = "application/strategic-merge-patch+json"
	JSONMerge      = "application/merge-patch+json"
	JSONPatch      = "application/json-patch+json"
)

// patchTypes are the Go types strategic merge patches of status writes
// need, by resource.
var patchTypes = map[string]any{"pods": corev1.Pod{}, "nodes": corev1.Node{}}

// MediaType is a Content-Type without its parameters.
func MediaType(contentType string) string {
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return contentType
	}
	return mt
}

// Apply applies a patch body to the JSON of an object of resource. The
// patch libraries are those kube-apiserver uses, and like it Apply turns
// a panic of theirs on a malformed patch (a JSON patch "replace" of the
// root without a value dereferences nil in json-patch v4) into an error
// instead of a crash.
func Apply(contentType string, original, patch []byte, resource string) (out []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = nil, fmt.Errorf("malformed patch: %v", r)
		}
	}()
	switch mt := MediaType(contentType); mt {
	case StrategicMerge:
		t, ok := patchTypes[resource]
		if !ok {
			return nil, fmt.Errorf("no strategic merge patch of %s offline", resource)
		}
		return strategicpatch.StrategicMergePatch(original, patch, t)
	case JSONMerge:
		return jsonpatch.MergePatch(original, patch)
	case JSONPatch:
		p, err := jsonpatch.DecodePatch(patch)
		if err != nil {
			return nil, err
		}
		return p.Apply(original)
	case "application/apply-patch+yaml", "application/apply-patch+cbor":
		return nil, fmt.Errorf("server-side apply needs the apiserver")
	default:
		return nil, fmt.Errorf("unknown patch type %q", mt)
	}
}

// Diffable reports whether a patch of this content type can be made as
// the difference between two objects (Between): strategic merge and
// JSON merge patches, not JSON patches (a list of operations).
func Diffable(contentType string) bool {
	switch MediaType(contentType) {
	case StrategicMerge, JSONMerge:
		return true
	}
	return false
}

// Between returns the patch, of contentType, that makes final out of
// base, made as kubelet makes its own status patches (a two-way
// strategic merge patch, or a JSON merge patch), without their
// resourceVersions (which the cache bumps on every local write, and
// which in a patch would be a precondition upstream).
func Between(contentType string, base, final []byte, resource string) ([]byte, error) {
	var err error
	if base, err = withoutResourceVersion(base); err != nil {
		return nil, err
	}
	if final, err = withoutResourceVersion(final); err != nil {
		return nil, err
	}
	switch MediaType(contentType) {
	case StrategicMerge:
		t, ok := patchTypes[resource]
		if !ok {
			return nil, fmt.Errorf("no strategic merge patch of %s offline", resource)
		}
		return strategicpatch.CreateTwoWayMergePatch(base, final, t)
	case JSONMerge:
		return jsonpatch.CreateMergePatch(base, final)
	}
	return nil, fmt.Errorf("patches of type %q are not coalesced", contentType)
}

func withoutResourceVersion(raw []byte) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	if meta, _ := m["metadata"].(map[string]any); meta != nil {
		delete(meta, "resourceVersion")
	}
	return json.Marshal(m)
}
