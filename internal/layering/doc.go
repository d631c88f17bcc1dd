// Package layering holds no code, only the test that keeps docs/design.md's
// import directions true: which packages may not import which, and why.
package layering
