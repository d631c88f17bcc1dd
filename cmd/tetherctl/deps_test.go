package main

import (
	"testing"

	"github.com/tether-edge/tether/internal/deptest"
)

// TestDeps keeps out of tetherctl what it must not link: it reads the
// cloud, the programs' /status and the self-managed CA's files, and
// holds nothing of its own.
func TestDeps(t *testing.T) {
	deptest.DepChecker{BadDeps: map[string]string{
		"go.etcd.io/bbolt/...":                               "tetherctl holds no store",
		"github.com/tether-edge/tether/poolstore":            "tetherctl reads a pool's records (poolstore/record), never its replica",
		"github.com/tether-edge/tether/poolstore/replica":    "tetherctl reads a pool's records (poolstore/record), never its replica",
		"github.com/tether-edge/tether/internal/localapi":    "tetherctl holds no store",
		"github.com/quic-go/quic-go/...":                     "tetherctl speaks HTTP to the cloud and to /status; the tunnel is the programs'",
		"github.com/tether-edge/tether/gateway":              "tetherctl reads /status through internal/statusapi, not the program (gateway/selfca, a leaf, is allowed)",
		"github.com/tether-edge/tether/edgeproxy/...":        "tetherctl reads /status through internal/statusapi, not the program",
		"github.com/tether-edge/tether/internal/testenv/...": "no production package imports test support",
	}}.Check(t)
}
