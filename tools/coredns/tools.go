//go:build tools

// Package tools pins CoreDNS, the reference the gateway's DNS server is
// benchmarked against (tools/bench-dns.sh runs its hosts plugin next to
// ours). It is built from the github.com/coredns/coredns module, never
// downloaded as a binary.
package tools

import (
	_ "github.com/coredns/coredns"
)
