package serve

import (
	"testing"

	"github.com/tether-edge/tether/poolstore/replica"
)

func open(t *testing.T, path string) *replica.Store {
	t.Helper()
	s, err := replica.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func mustNil(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
