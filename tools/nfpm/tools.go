//go:build tools

// Package tools pins nfpm, which `make package` runs to build Tether's deb
// and rpm packages. v2.45.0 is the newest release whose dependencies the
// module proxy serves (see ENVIRONMENT.md); tools/build-nfpm.sh builds it
// into ~/.cache/tether/nfpm-<version>/.
package tools

import _ "github.com/goreleaser/nfpm/v2/cmd/nfpm"
