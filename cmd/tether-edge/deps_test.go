package main

import (
	"testing"

	"github.com/tether-edge/tether/internal/deptest"
)

// TestDeps keeps out of tether-edge what it must not link.
func TestDeps(t *testing.T) {
	// client-go's clientset registers every built-in API group at start,
	// which costs an idle edge node megabytes of memory (see
	// internal/kube). Only the gateway and tetherctl use it.
	const clientset = "the clientset costs an idle edge node megabytes (internal/kube is the edge's narrow client); go mod why -m shows who imports it"
	deptest.DepChecker{BadDeps: map[string]string{
		"k8s.io/client-go/kubernetes/...":                    clientset + " (the clientset, its scheme and typed clients)",
		"k8s.io/client-go/informers/...":                     clientset,
		"k8s.io/client-go/tools/leaderelection/...":          clientset + " (poolstore's elector is written on internal/kube)",
		"k8s.io/client-go/util/certificate/...":              clientset + " (edgeproxy/nodecert rotates the node certificate)",
		"k8s.io/client-go/testing/...":                       clientset + " (gentype's fakes and their managed-fields machinery)",
		"github.com/mholt/acmez/v3/...":                      "ACME certificates are the gateway's",
		"github.com/tether-edge/tether/gateway/...":          "the two programs never import each other: what they share lives below both",
		"github.com/tether-edge/tether/internal/testenv/...": "no production package imports test support",
	}}.Check(t)
}
