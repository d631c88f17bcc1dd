package cache

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/internal/localapi"
)

// Object is one API object as the cache holds it: the identity and labels
// read from its metadata, and its JSON.
type Object struct {
	Kind, APIVersion     string
	Namespace, Name, UID string
	// RV is metadata.resourceVersion as a number (0 if it is not one).
	RV     uint64
	Labels map[string]string
	// Raw is the object's JSON, with kind and apiVersion.
	Raw []byte

	top    map[string]json.RawMessage // Raw's top level, for field selectors
	fields map[string]string          // values of indexed fields, from a record
}

// objectMeta is the part of an object DecodeObject reads.
type objectMeta struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	Metadata   struct {
		Name            string            `json:"name"`
		Namespace       string            `json:"namespace"`
		UID             string            `json:"uid"`
		ResourceVersion string            `json:"resourceVersion"`
		Labels          map[string]string `json:"labels"`
	} `json:"metadata"`
}

// DecodeObject reads raw's metadata. kind and apiVersion are put into the
// JSON when raw lacks them, as items of a list do. Object.Raw may share
// raw's memory.
func DecodeObject(raw []byte, kind, apiVersion string) (*Object, error) {
	var m objectMeta
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("decode object: %w", err)
	}
	if m.Metadata.Name == "" {
		return nil, fmt.Errorf("decode object: no metadata.name")
	}
	o := &Object{
		Kind: m.Kind, APIVersion: m.APIVersion,
		Namespace: m.Metadata.Namespace, Name: m.Metadata.Name, UID: m.Metadata.UID,
		RV: ParseRV(m.Metadata.ResourceVersion), Labels: m.Metadata.Labels, Raw: raw,
	}
	if o.Kind == "" && kind != "" {
		o.Kind, o.APIVersion = kind, apiVersion
		o.Raw = withTypeMeta(raw, kind, apiVersion)
	}
	return o, nil
}

// withTypeMeta returns the JSON object raw with kind and apiVersion first.
func withTypeMeta(raw []byte, kind, apiVersion string) []byte {
	body := bytes.TrimSpace(raw)
	body = bytes.TrimSpace(body[1:]) // DecodeObject checked it is an object
	k, _ := json.Marshal(kind)
	v, _ := json.Marshal(apiVersion)
	out := make([]byte, 0, len(raw)+len(k)+len(v)+26)
	out = append(out, `{"kind":`...)
	out = append(out, k...)
	out = append(out, `,"apiVersion":`...)
	out = append(out, v...)
	if len(body) > 0 && body[0] != '}' {
		out = append(out, ',')
	}
	return append(out, body...)
}

// Key is the object's key in its resource's bucket: namespace/name.
func (o *Object) Key() string { return o.Namespace + "/" + o.Name }

// Field returns the value of a field selector's field, such as
// spec.nodeName or status.phase: the JSON value at that dotted path,
// as a string ("" when absent, "true"/"false" for booleans, numbers as
// written).
func (o *Object) Field(path string) string {
	switch path {
	case "metadata.name":
		return o.Name
	case "metadata.namespace":
		return o.Namespace
	}
	if v, ok := o.fields[path]; ok {
		return v
	}
	v, ok := o.fieldValue(path)
	if !ok {
		return ""
	}
	var x any
	d := json.NewDecoder(bytes.NewReader(v))
	d.UseNumber()
	if d.Decode(&x) != nil {
		return ""
	}
	switch x := x.(type) {
	case string:
		return x
	case bool:
		return strconv.FormatBool(x)
	case json.Number:
		return x.String()
	}
	return ""
}

// fieldValue returns the raw JSON at a dotted path. It decodes one level
// at a time into raw messages, which is much cheaper than decoding the
// whole object; the top level is kept for the next field.
func (o *Object) fieldValue(path string) (json.RawMessage, bool) {
	if o.top == nil {
		if json.Unmarshal(o.Raw, &o.top) != nil {
			o.top = map[string]json.RawMessage{}
		}
	}
	first, rest, nested := strings.Cut(path, ".")
	v, ok := o.top[first]
	for ok && nested {
		var m map[string]json.RawMessage
		if json.Unmarshal(v, &m) != nil {
			return nil, false
		}
		first, rest, nested = strings.Cut(rest, ".")
		v, ok = m[first]
	}
	return v, ok
}

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
func (o *Object) indexFields() map[string]string {
	paths := indexedFields[o.Kind]
	if len(paths) == 0 {
		return nil
	}
	f := make(map[string]string, len(paths))
	for _, p := range paths {
		f[p] = o.Field(p)
	}
	return f
}

// ParseRV reads a resourceVersion; one that is not a number is 0.
func ParseRV(s string) uint64 {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// Scope is what a list or watch covers: a namespace and label and field
// selectors (localapi.Scope, which the pool replica serves with too). Its
// Matches reads an Object's fields with Object.Field.
type Scope = localapi.Scope

// GetLabels returns the object's labels (for localapi.Scope).
func (o *Object) GetLabels() map[string]string { return o.Labels }

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
