package deptest

import (
	"fmt"
	"strings"
	"testing"
)

// TestForbids: exact entries match only themselves, "/..." entries the
// path and what is below it, not a longer sibling.
func TestForbids(t *testing.T) {
	c := DepChecker{BadDeps: map[string]string{
		"k8s.io/client-go/kubernetes": "exact",
		"go.etcd.io/bbolt/...":        "tree",
	}}
	for _, tc := range []struct {
		dep, pattern string
	}{
		{"k8s.io/client-go/kubernetes", "k8s.io/client-go/kubernetes"},
		{"k8s.io/client-go/kubernetes/typed/core/v1", ""},
		{"go.etcd.io/bbolt", "go.etcd.io/bbolt/..."},
		{"go.etcd.io/bbolt/internal/freelist", "go.etcd.io/bbolt/..."},
		{"go.etcd.io/bboltx", ""},
		{"k8s.io/client-go/dynamic", ""},
	} {
		pattern, _, ok := c.Forbids(tc.dep)
		if pattern != tc.pattern || ok != (tc.pattern != "") {
			t.Errorf("Forbids(%s) = %q, %v; want %q", tc.dep, pattern, ok, tc.pattern)
		}
	}
}

// recorder is a testing.TB that keeps the errors reported to it.
type recorder struct {
	testing.TB
	errors []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

// TestCheckFails runs the real check on this package, which links
// encoding/json: a table forbidding it fails, naming the reason, and so
// does an entry naming no package (guards against a check that can no
// longer fail).
func TestCheckFails(t *testing.T) {
	for _, tc := range []struct {
		bad  map[string]string
		want string
	}{
		{map[string]string{"encoding/json": "the reason"}, `/deptest depends on encoding/json (BadDeps "encoding/json"): the reason`},
		{map[string]string{"encoding/...": "the reason"}, `(BadDeps "encoding/..."): the reason`},
		{map[string]string{"go.etcd.io/bbolt/nosuchpackage": "a typo"}, "BadDeps names go.etcd.io/bbolt/nosuchpackage, which is no package"},
		{map[string]string{"go.etcd.io/bbolt": "not linked here"}, ""},
	} {
		r := &recorder{TB: t}
		DepChecker{BadDeps: tc.bad}.Check(r)
		if tc.want == "" {
			if len(r.errors) != 0 {
				t.Errorf("%v: %q; want no error", tc.bad, r.errors)
			}
			continue
		}
		if len(r.errors) == 0 || !strings.Contains(strings.Join(r.errors, "\n"), tc.want) {
			t.Errorf("%v: %q; want an error containing %q", tc.bad, r.errors, tc.want)
		}
	}
}
