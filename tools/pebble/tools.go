//go:build tools

// Package tools pins Pebble, the ACME test server the gateway's ACME mode
// is tested against (internal/testenv.StartPebble): real orders, real
// HTTP-01 validation, short-lived certificates. Built from its module by
// tools/build-testbins.sh, never downloaded as a binary.
package tools

import _ "github.com/letsencrypt/pebble/v2/cmd/pebble"
