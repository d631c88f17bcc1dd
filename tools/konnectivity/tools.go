//go:build tools

// Package tools pins Konnectivity (apiserver-network-proxy), the tunnel
// tunnelbench measures Tether against: its proxy-server and proxy-agent,
// built from the module by tools/build-konnectivity.sh, never downloaded
// as binaries.
package tools

import (
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/agent"
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/server"
)
