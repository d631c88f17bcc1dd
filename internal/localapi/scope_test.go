package localapi

import (
	"net/url"
	"testing"
)

// object is a Scope's view of a test object.
type object struct {
	namespace, name string
	labels          map[string]string
	fields          map[string]string
}

func (o object) GetLabels() map[string]string { return o.labels }

func (o object) Field(path string) string {
	switch path {
	case "metadata.name":
		return o.name
	case "metadata.namespace":
		return o.namespace
	}
	return o.fields[path]
}

func TestScope(t *testing.T) {
	web := object{"a", "web-1", map[string]string{"app": "web"}, map[string]string{"spec.nodeName": "n1"}}
	db := object{"a", "db-1", map[string]string{"app": "db"}, map[string]string{"spec.nodeName": "n1"}}
	other := object{"b", "web-2", map[string]string{"app": "web"}, map[string]string{"spec.nodeName": "n2"}}
	for _, tc := range []struct {
		namespace, name, query string
		want                   []object
		selective, content     bool
	}{
		{"", "", "", []object{web, db, other}, false, false},
		{"a", "", "", []object{web, db}, false, false},
		{"", "", "labelSelector=app%3Dweb", []object{web, other}, true, true},
		{"", "", "labelSelector=app+in+(db)", []object{db}, true, true},
		{"a", "", "fieldSelector=spec.nodeName%3Dn1", []object{web, db}, true, true},
		{"", "", "fieldSelector=spec.nodeName!%3Dn1", []object{other}, true, true},
		{"", "", "fieldSelector=metadata.name!%3Dweb-1", []object{db, other}, true, false},
		{"", "", "fieldSelector=metadata.namespace%3D%3Db", []object{other}, true, false},
		{"a", "web-1", "", []object{web}, true, false},
		{"a", "web-1", "labelSelector=app%3Ddb", nil, true, true},
		{"c", "", "", nil, false, false},
	} {
		q, _ := url.ParseQuery(tc.query)
		s, err := ParseScope(tc.namespace, tc.name, q)
		if err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		var got []object
		for _, o := range []object{web, db, other} {
			if s.Matches(o) {
				got = append(got, o)
			}
			if key, content := s.MatchesKey(o.namespace, o.name), s.MatchesContent(o.labels, o.Field); (key && content) != s.Matches(o) {
				t.Errorf("%+v: %s: key %v, content %v, matches %v", tc, o.name, key, content, s.Matches(o))
			}
		}
		if len(got) != len(tc.want) {
			t.Errorf("%+v: matched %v", tc, got)
		} else {
			for i := range got {
				if got[i].name != tc.want[i].name {
					t.Errorf("%+v: matched %v", tc, got)
				}
			}
		}
		if s.Selective() != tc.selective || s.FiltersContent() != tc.content {
			t.Errorf("%+v: selective %v, filters content %v", tc, s.Selective(), s.FiltersContent())
		}
	}
	for _, bad := range []string{"labelSelector=a+in+(", "fieldSelector=a%3D%3D%3D"} {
		q, _ := url.ParseQuery(bad)
		if _, err := ParseScope("", "", q); err == nil {
			t.Errorf("%s: parsed", bad)
		}
	}
}
