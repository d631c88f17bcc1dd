package poolstore

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/tether-edge/tether/poolstore/replica"
)

const slices_ = "discovery.k8s.io/v1/endpointslices"

func slice(ns, name string, rv uint64, labels ...string) json.RawMessage {
	l := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		l[labels[i]] = labels[i+1]
	}
	b, _ := json.Marshal(map[string]any{
		"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1", "addressType": "IPv4",
		"metadata": map[string]any{"namespace": ns, "name": name, "resourceVersion": fmt.Sprint(rv), "labels": l},
	})
	return b
}

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
