package localapi

import (
	"fmt"
	"net/url"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// Scope is what a list or watch covers: a namespace ("" for all) and
// label and field selectors (nil or empty select everything). A field
// selector's requirements use =, == or !=, as kube-apiserver's do.
type Scope struct {
	Namespace string
	Labels    labels.Selector
	Fields    fields.Selector
}

// ParseScope reads the scope of a list or watch in namespace from its
// query (labelSelector, fieldSelector). A name (the legacy watch path of
// one object) narrows it to that object.
func ParseScope(namespace, name string, q url.Values) (Scope, error) {
	s := Scope{Namespace: namespace}
	var err error
	if s.Labels, err = labels.Parse(q.Get("labelSelector")); err != nil {
		return s, fmt.Errorf("labelSelector: %w", err)
	}
	if s.Fields, err = fields.ParseSelector(q.Get("fieldSelector")); err != nil {
		return s, fmt.Errorf("fieldSelector: %w", err)
	}
	return s.WithName(name), nil
}

// WithName returns the scope narrowed to the objects named name
// (metadata.name=name); "" leaves it as it is.
func (s Scope) WithName(name string) Scope {
	if name == "" {
		return s
	}
	sel := fields.OneTermEqualSelector("metadata.name", name)
	if s.Fields != nil {
		sel = fields.AndSelectors(s.Fields, sel)
	}
	s.Fields = sel
	return s
}

// keyField reports whether a field selector's field is one of an
// object's key, which every resource supports and which never changes.
func keyField(f string) bool { return f == "metadata.name" || f == "metadata.namespace" }

func hasLabels(s Scope) bool { return s.Labels != nil && !s.Labels.Empty() }
func hasFields(s Scope) bool { return s.Fields != nil && !s.Fields.Empty() }

// Selective reports whether the scope has selectors (beyond a
// namespace).
func (s Scope) Selective() bool { return hasLabels(s) || hasFields(s) }

// FiltersContent reports whether the scope depends on what can change in
// an object (its labels, fields other than its namespace and name), not
// only on its key: an object can enter and leave it.
func (s Scope) FiltersContent() bool {
	if hasLabels(s) {
		return true
	}
	if hasFields(s) {
		for _, r := range s.Fields.Requirements() {
			if !keyField(r.Field) {
				return true
			}
		}
	}
	return false
}

// Matches reports whether o is in the scope. Its fields are read as
// Object.Field reads them, its JSON decoded at most once.
func (s Scope) Matches(o *Object) bool {
	r := fieldReader{o: o}
	return s.MatchesKey(o.Namespace, o.Name) && s.MatchesContent(o.Labels, r.field)
}

// MatchesKey reports whether an object's namespace and name are in the
// scope (the namespace, and field requirements on metadata.name and
// metadata.namespace); they never change, so neither does the answer.
func (s Scope) MatchesKey(namespace, name string) bool {
	if s.Namespace != "" && namespace != s.Namespace {
		return false
	}
	if !hasFields(s) {
		return true
	}
	for _, r := range s.Fields.Requirements() {
		switch r.Field {
		case "metadata.name":
			if !holds(r, name) {
				return false
			}
		case "metadata.namespace":
			if !holds(r, namespace) {
				return false
			}
		}
	}
	return true
}

// MatchesContent reports whether an object with labels l matches the
// scope's label selector and its field requirements on fields other than
// metadata.name and metadata.namespace, whose values field returns (""
// for a field the object lacks).
func (s Scope) MatchesContent(l map[string]string, field func(path string) string) bool {
	if hasLabels(s) && !s.Labels.Matches(labels.Set(l)) {
		return false
	}
	if !hasFields(s) {
		return true
	}
	for _, r := range s.Fields.Requirements() {
		if !keyField(r.Field) && !holds(r, field(r.Field)) {
			return false
		}
	}
	return true
}

// holds reports whether value meets a field requirement.
func holds(r fields.Requirement, value string) bool {
	return (value == r.Value) != (r.Operator == selection.NotEquals)
}
