// Package version holds the build's version, set by the linker from git
// (see the Makefile) and "dev" otherwise.
package version

// Version is the release this binary was built from.
var Version = "dev"
