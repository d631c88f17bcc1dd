package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/tether-edge/tether/e2e/world"
)

// TestSecurityDocNamesRealTests: every test SECURITY.md names as the proof
// of a promise (`package.TestName`, `package.FuzzName`, with or without a
// subtest) is a test or fuzz function of a package of that name, so a
// renamed or deleted test cannot leave a promise without its proof.
func TestSecurityDocNamesRealTests(t *testing.T) {
	root := world.RepoRoot()
	doc, err := os.ReadFile(filepath.Join(root, "SECURITY.md"))
	if err != nil {
		t.Fatal(err)
	}
	// Test functions by package name: "poolstore" -> {"TestX": true}.
	funcs := map[string]map[string]bool{}
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := strings.TrimSuffix(f.Name.Name, "_test")
		if funcs[pkg] == nil {
			funcs[pkg] = map[string]bool{}
		}
		for _, decl := range f.Decls {
			if fd, ok := decl.(*ast.FuncDecl); ok && fd.Recv == nil {
				funcs[pkg][fd.Name.Name] = true
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ref := regexp.MustCompile("`([a-z][a-z0-9]*)\\.((?:Test|Fuzz)[A-Za-z0-9_]*)(/[^`]*)?`")
	matches := ref.FindAllStringSubmatch(string(doc), -1)
	if len(matches) < 50 {
		t.Fatalf("SECURITY.md names %d tests; the pattern no longer finds them", len(matches))
	}
	for _, m := range matches {
		if m[1] == "package" {
			continue // the document's own example of the notation
		}
		if !funcs[m[1]][m[2]] {
			t.Errorf("SECURITY.md names %s.%s, which no package %s has", m[1], m[2], m[1])
		}
	}
}
