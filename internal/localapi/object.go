package localapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// Object is one API object as a local store holds it: the identity and
// labels read from its metadata, and its JSON. Raw must not be modified.
type Object struct {
	Kind, APIVersion     string
	Namespace, Name, UID string
	// RV is metadata.resourceVersion as a number (0 if it is not one).
	RV     uint64
	Labels map[string]string
	// Raw is the object's JSON, with kind and apiVersion when it was
	// decoded with them (see DecodeObject).
	Raw []byte
	// Indexed are values of fields a store keeps beside the JSON, by
	// path (the apiserver cache's records hold those of the fields it
	// indexes): Field answers them without reading Raw.
	Indexed map[string]string
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

// DecodeObject reads raw's metadata; an object without metadata.name is
// an error. kind and apiVersion are put into the JSON when raw lacks
// them, as items of a list do. Object.Raw may share raw's memory.
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

// ParseRV reads a resourceVersion; one that is not a number is 0.
func ParseRV(s string) uint64 {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// WithResourceVersion returns the JSON object raw with
// metadata.resourceVersion set to rv (and metadata made an object if it
// is not one), and kind and apiVersion set when it has no kind and kind
// is not "". The other members' JSON is kept as it is.
func WithResourceVersion(raw []byte, rv uint64, kind, apiVersion string) ([]byte, error) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, err
	}
	if obj == nil {
		return nil, fmt.Errorf("not an object: %.20s", raw)
	}
	var meta map[string]json.RawMessage
	if json.Unmarshal(obj["metadata"], &meta) != nil || meta == nil {
		meta = map[string]json.RawMessage{}
	}
	meta["resourceVersion"], _ = json.Marshal(strconv.FormatUint(rv, 10))
	var err error
	if obj["metadata"], err = json.Marshal(meta); err != nil {
		return nil, err
	}
	if k := obj["kind"]; (k == nil || string(k) == "null") && kind != "" {
		obj["kind"], _ = json.Marshal(kind)
		obj["apiVersion"], _ = json.Marshal(apiVersion)
	}
	return json.Marshal(obj)
}

// Key is the object's key in its resource: namespace/name.
func (o *Object) Key() string { return o.Namespace + "/" + o.Name }

// Field returns the value of a field selector's field, such as
// spec.nodeName or status.phase: the JSON value at that dotted path, as
// a string ("" when absent, "true"/"false" for booleans, numbers as
// written). metadata.name and metadata.namespace, and the Indexed
// fields, are answered without reading Raw.
func (o *Object) Field(path string) string {
	r := fieldReader{o: o}
	return r.field(path)
}

// FieldValues returns the values of the fields at paths (as Field reads
// them), reading Raw at most once; nil when paths is empty.
func (o *Object) FieldValues(paths []string) map[string]string {
	if len(paths) == 0 {
		return nil
	}
	r := fieldReader{o: o}
	f := make(map[string]string, len(paths))
	for _, p := range paths {
		f[p] = r.field(p)
	}
	return f
}

// fieldReader reads fields of one object, decoding the top level of its
// JSON at most once for all of them.
type fieldReader struct {
	o   *Object
	top map[string]json.RawMessage
}

func (r *fieldReader) field(path string) string {
	switch path {
	case "metadata.name":
		return r.o.Name
	case "metadata.namespace":
		return r.o.Namespace
	}
	if v, ok := r.o.Indexed[path]; ok {
		return v
	}
	v, ok := r.value(path)
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

// value returns the raw JSON at a dotted path. It decodes one level at a
// time into raw messages, which is much cheaper than decoding the whole
// object; the top level is kept for the next field.
func (r *fieldReader) value(path string) (json.RawMessage, bool) {
	if r.top == nil {
		if json.Unmarshal(r.o.Raw, &r.top) != nil {
			r.top = map[string]json.RawMessage{}
		}
	}
	first, rest, nested := strings.Cut(path, ".")
	v, ok := r.top[first]
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
