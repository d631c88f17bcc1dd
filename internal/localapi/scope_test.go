package localapi

import (
	"net/url"
	"testing"
)

// object is a test object whose fields are indexed (Raw is not read).
func object(namespace, name string, labels, fields map[string]string) *Object {
	return &Object{Namespace: namespace, Name: name, Labels: labels, Indexed: fields}
}

func TestScope(t *testing.T) {
	web := object("a", "web-1", map[string]string{"app": "web"}, map[string]string{"spec.nodeName": "n1"})
	db := object("a", "db-1", map[string]string{"app": "db"}, map[string]string{"spec.nodeName": "n1"})
	other := object("b", "web-2", map[string]string{"app": "web"}, map[string]string{"spec.nodeName": "n2"})
	for _, tc := range []struct {
		namespace, name, query string
		want                   []*Object
		selective, content     bool
	}{
		{"", "", "", []*Object{web, db, other}, false, false},
		{"a", "", "", []*Object{web, db}, false, false},
		{"", "", "labelSelector=app%3Dweb", []*Object{web, other}, true, true},
		{"", "", "labelSelector=app+in+(db)", []*Object{db}, true, true},
		{"a", "", "fieldSelector=spec.nodeName%3Dn1", []*Object{web, db}, true, true},
		{"", "", "fieldSelector=spec.nodeName!%3Dn1", []*Object{other}, true, true},
		{"", "", "fieldSelector=metadata.name!%3Dweb-1", []*Object{db, other}, true, false},
		{"", "", "fieldSelector=metadata.namespace%3D%3Db", []*Object{other}, true, false},
		{"a", "web-1", "", []*Object{web}, true, false},
		{"a", "web-1", "labelSelector=app%3Ddb", nil, true, true},
		{"c", "", "", nil, false, false},
	} {
		q, _ := url.ParseQuery(tc.query)
		s, err := ParseScope(tc.namespace, tc.name, q)
		if err != nil {
			t.Fatalf("%+v: %v", tc, err)
		}
		var got []*Object
		for _, o := range []*Object{web, db, other} {
			if s.Matches(o) {
				got = append(got, o)
			}
			if key, content := s.MatchesKey(o.Namespace, o.Name), s.MatchesContent(o.Labels, o.Field); (key && content) != s.Matches(o) {
				t.Errorf("%+v: %s: key %v, content %v, matches %v", tc, o.Name, key, content, s.Matches(o))
			}
		}
		if len(got) != len(tc.want) {
			t.Errorf("%+v: matched %v", tc, got)
		} else {
			for i := range got {
				if got[i].Name != tc.want[i].Name {
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
