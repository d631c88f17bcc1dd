package main

import (
	"testing"

	"github.com/tether-edge/tether/internal/deptest"
)

// TestDeps keeps out of tether-gateway what it must not link.
func TestDeps(t *testing.T) {
	const store = "the gateway keeps no local store: its state is in the cloud, and of the pool it reads and writes only the records (poolstore/record)"
	deptest.DepChecker{BadDeps: map[string]string{
		"go.etcd.io/bbolt/...":                               store,
		"github.com/tether-edge/tether/internal/boltfile":    store,
		"github.com/tether-edge/tether/internal/localapi":    "serving kube-apiserver reads from a local store is the edge's (its offline cache and pool replica)",
		"github.com/tether-edge/tether/poolstore":            "the pool's replica, replication and serving run on the edge; the gateway needs only poolstore/record",
		"github.com/tether-edge/tether/poolstore/elect":      "the gateway writes the pools' records for their members; it never campaigns",
		"github.com/tether-edge/tether/poolstore/replica":    store,
		"github.com/tether-edge/tether/poolstore/serve":      "serving the pool's replica is the edge's",
		"github.com/tether-edge/tether/edgeproxy/...":        "the two programs never import each other: what they share lives below both",
		"github.com/tether-edge/tether/internal/testenv/...": "no production package imports test support",
	}}.Check(t)
}
