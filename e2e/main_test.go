// Package e2e runs Tether's real binaries in network namespaces against a
// real kube-apiserver: a cloud client reaches edge nodes behind NAT through
// tether-gateway and tether-edge. Needs root.
package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/tether-edge/tether/e2e/world"
)

var bins world.Binaries

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		// Every test here needs root, namespaces and a control plane.
		fmt.Println("e2e: skipped with -short")
		os.Exit(0)
	}
	if os.Geteuid() != 0 && os.Getenv("CI") == "" {
		fmt.Println("e2e: skipped, needs root")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "tether-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bins, err = world.BuildBinaries(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
