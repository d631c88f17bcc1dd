package testenv

import (
	"fmt"
	"testing"
)

// stopT records how a requirement stopped a test.
type stopT struct {
	leakT
	skipped, failed string
}

func (s *stopT) Skip(args ...any)             { s.skipped = fmt.Sprint(args...) }
func (s *stopT) Fatalf(f string, args ...any) { s.failed = fmt.Sprintf(f, args...) }

// Under CI a test that needs root fails instead of skipping: a CI run
// cannot pass by skipping what it was meant to run.
func TestRequireRoot(t *testing.T) {
	for _, tc := range []struct {
		name        string
		euid        int
		ci          string
		skip, fatal bool
	}{
		{"root", 0, "", false, false},
		{"root in CI", 0, "true", false, false},
		{"not root", 1000, "", true, false},
		{"not root in CI", 1000, "true", false, true},
		{"not root in CI, any value", 1000, "1", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &stopT{}
			requireRoot(s, tc.euid, tc.ci)
			if (s.skipped != "") != tc.skip || (s.failed != "") != tc.fatal {
				t.Errorf("skipped %q, failed %q; want skip %v, fail %v", s.skipped, s.failed, tc.skip, tc.fatal)
			}
		})
	}
}
