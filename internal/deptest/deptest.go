// Package deptest checks what a program links, in the spirit of
// tailscale's tstest/deptest: each binary's test holds a table of the
// packages it must not depend on, directly or not, with the reason for
// each, and fails naming the package and the reason when one creeps in.
//
// internal/layering keeps the import directions between the project's
// own layers; this keeps out of each binary what would cost its users
// (memory, size, a store it must not have) whichever layer brings it in.
package deptest

import (
	"encoding/json"
	"maps"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// DepChecker is one program's table of forbidden dependencies.
type DepChecker struct {
	// Pkg is the package to check, as `go list` takes it; "." (the
	// package of the test) when empty.
	Pkg string
	// BadDeps maps an import path, or "path/..." for the path and every
	// package below it, to why Pkg must not depend on it.
	BadDeps map[string]string
}

// Check fails t for each dependency of c.Pkg that c.BadDeps forbids, and
// for an entry of BadDeps that names no package (a typo would disable it
// silently). Test files are not part of the program and are not checked.
func (c DepChecker) Check(t testing.TB) {
	t.Helper()
	pkg := c.Pkg
	if pkg == "" {
		pkg = "."
	}
	p := Load(t, pkg)
	found := map[string][]string{} // pattern: the dependencies it forbids
	for _, d := range p.Deps {
		if pattern, _, ok := c.Forbids(d); ok {
			found[pattern] = append(found[pattern], d)
		}
	}
	for _, pattern := range slices.Sorted(maps.Keys(found)) {
		t.Errorf("%s depends on %s (BadDeps %q): %s", p.ImportPath, strings.Join(found[pattern], ", "), pattern, c.BadDeps[pattern])
	}
	var paths []string
	for pattern := range c.BadDeps {
		paths = append(paths, strings.TrimSuffix(pattern, "/..."))
	}
	slices.Sort(paths)
	args := append([]string{"list", "-find", "-e", "-json=ImportPath,Error"}, paths...)
	for _, p := range list(t, args...) {
		if p.Error != nil {
			t.Errorf("BadDeps names %s, which is no package: %s", p.ImportPath, p.Error.Err)
		}
	}
}

// Forbids reports whether c.BadDeps forbids the dependency dep, and by
// which entry and why.
func (c DepChecker) Forbids(dep string) (pattern, why string, ok bool) {
	if why, ok := c.BadDeps[dep]; ok {
		return dep, why, true
	}
	for pattern, why := range c.BadDeps {
		if base, ok := strings.CutSuffix(pattern, "/..."); ok && (dep == base || strings.HasPrefix(dep, base+"/")) {
			return pattern, why, true
		}
	}
	return "", "", false
}

// Load is pkg with what it depends on, directly or not, in the build of
// this machine, test files excluded (`go list -deps`). It fails t when go
// list fails or finds implausibly few dependencies.
func Load(t testing.TB, pkg string) Package {
	t.Helper()
	ps := list(t, "list", "-json=ImportPath,Deps", pkg)
	if len(ps) != 1 {
		t.Fatalf("go list %s: %d packages, want 1", pkg, len(ps))
	}
	if len(ps[0].Deps) < 50 {
		t.Fatalf("go list %s: only %d dependencies: %q", pkg, len(ps[0].Deps), ps[0].Deps)
	}
	return ps[0]
}

// Package is what deptest reads of `go list -json`.
type Package struct {
	ImportPath string
	Deps       []string
	Error      *struct{ Err string }
}

// list runs the go command with args, which ask for JSON, and decodes
// the packages it prints.
func list(t testing.TB, args ...string) []Package {
	t.Helper()
	cmd := exec.Command("go", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	var ps []Package
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p Package
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("go %s: %v", strings.Join(args, " "), err)
		}
		ps = append(ps, p)
	}
	return ps
}
