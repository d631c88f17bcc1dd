package docgen

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// MaxHelp is the longest Help a metric may have, in characters.
const MaxHelp = 120

// metricNameRE is a Tether metric's name: tether_, then snake case.
var metricNameRE = regexp.MustCompile(`^tether_[a-z][a-z0-9]*(_[a-z0-9]+)*$`)

// MetricStyle lists how m breaks the metrics convention (nil when it
// keeps it): its name is tether_ in snake case, a counter's and only a
// counter's ends in _total (m.Type "" is not checked), and its Help is one
// sentence of at most MaxHelp characters that begins with a capital,
// ends in a period and quotes no number (numbers live in the docs).
func MetricStyle(m Metric) []string {
	var out []string
	if !metricNameRE.MatchString(m.Name) {
		out = append(out, "name: want tether_ and snake case")
	}
	total := strings.HasSuffix(m.Name, "_total")
	switch {
	case m.Type == "counter" && !total:
		out = append(out, "name: a counter's ends in _total")
	case m.Type != "" && m.Type != "counter" && total:
		out = append(out, "name: only a counter's ends in _total, this is a "+m.Type)
	}
	h := m.Help
	switch n := utf8.RuneCountInString(h); {
	case n == 0:
		out = append(out, "help: empty")
		return out
	case n > MaxHelp:
		out = append(out, fmt.Sprintf("help: %d characters, want at most %d", n, MaxHelp))
	}
	if r, _ := utf8.DecodeRuneInString(h); !unicode.IsUpper(r) {
		out = append(out, "help: begin with a capital")
	}
	if !strings.HasSuffix(h, ".") {
		out = append(out, "help: end with a period")
	}
	for _, end := range []string{". ", "? ", "! "} {
		if strings.Contains(h, end) {
			out = append(out, fmt.Sprintf("help: one sentence, not two (%q)", end))
			break
		}
	}
	if strings.ContainsFunc(h, unicode.IsDigit) {
		out = append(out, "help: quotes a number; numbers live in the docs")
	}
	return out
}

// CheckMetricStyle returns the problems of every metric of ms that breaks
// the convention (MetricStyle), one line each, sorted.
func CheckMetricStyle(ms []Metric) []string {
	var out []string
	for _, m := range ms {
		for _, p := range MetricStyle(m) {
			out = append(out, fmt.Sprintf("%s: %s (help %q)", m.Name, p, m.Help))
		}
	}
	slices.Sort(out)
	return out
}

// Where the metrics convention lets code register with MustRegister: the
// registering helper and the admin endpoint's base registry.
var mustRegisterAllowed = []string{"internal/promreg", "internal/admin"}

// Constructors of package prometheus that build no collector.
var notCollectors = []string{"NewRegistry", "NewPedanticRegistry"}

const prometheusPath = "github.com/prometheus/client_golang/prometheus"

// CheckMetricSources scans the non-test Go files under root (a module's
// root directory) and lists, one line each as "path:line: problem", the
// code that breaks the metrics convention: a MustRegister call outside
// internal/promreg and internal/admin; a collector or descriptor
// constructor of package prometheus (prometheus.New..., registries aside)
// in a file not named metrics.go; a Namespace or Subsystem field in
// prometheus options (the full name is the Name); an import of promauto,
// which registers with the global registry. Paths (slash-separated,
// relative to root) that match a pattern of skip are not read: a pattern
// "dir/" skips a tree, any other is a filepath.Match pattern ("dir/*.go").
// Directories named testdata or starting with "." or "_" are skipped too.
func CheckMetricSources(root string, skip []string) ([]string, error) {
	var out []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel != "." && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || skipped(rel+"/", skip)) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") || skipped(rel, skip) {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		out = append(out, checkFile(fset, f, rel)...)
		return nil
	})
	return out, err
}

func skipped(rel string, skip []string) bool {
	for _, pat := range skip {
		if strings.HasSuffix(pat, "/") {
			if strings.HasPrefix(rel, pat) {
				return true
			}
			continue
		}
		if ok, _ := filepath.Match(pat, rel); ok {
			return true
		}
	}
	return false
}

// checkFile lists the problems of one file, rel being its path.
func checkFile(fset *token.FileSet, f *ast.File, rel string) []string {
	var out []string
	report := func(n ast.Node, format string, args ...any) {
		out = append(out, fmt.Sprintf("%s:%d: %s", rel, fset.Position(n.Pos()).Line, fmt.Sprintf(format, args...)))
	}
	prom := "" // the name the file gives package prometheus
	for _, imp := range f.Imports {
		path, _ := strconv.Unquote(imp.Path.Value)
		switch path {
		case prometheusPath:
			prom = "prometheus"
			if imp.Name != nil {
				prom = imp.Name.Name
			}
		case prometheusPath + "/promauto":
			report(imp, "promauto registers with the global registry: build collectors in newMetrics and register them with promreg.Register")
		}
	}
	dir := filepath.ToSlash(filepath.Dir(rel))
	metricsFile := filepath.Base(rel) == "metrics.go"
	isProm := func(e ast.Expr) (string, bool) {
		sel, ok := e.(*ast.SelectorExpr)
		if !ok || prom == "" {
			return "", false
		}
		x, ok := sel.X.(*ast.Ident)
		return sel.Sel.Name, ok && x.Name == prom
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "MustRegister" && !slices.Contains(mustRegisterAllowed, dir) {
				report(n, "MustRegister panics: register in newMetrics with promreg.Register and return the error")
			}
			if name, ok := isProm(n.Fun); ok && strings.HasPrefix(name, "New") && !slices.Contains(notCollectors, name) && !metricsFile {
				report(n, "prometheus.%s outside metrics.go: keep the package's collectors in its metrics.go", name)
			}
		case *ast.CompositeLit:
			name, ok := isProm(n.Type)
			if !ok || !strings.HasSuffix(name, "Opts") {
				return true
			}
			for _, e := range n.Elts {
				kv, ok := e.(*ast.KeyValueExpr)
				if !ok {
					continue
				}
				if k, ok := kv.Key.(*ast.Ident); ok && (k.Name == "Namespace" || k.Name == "Subsystem") {
					report(kv, "%s in prometheus.%s: write the full name in Name", k.Name, name)
				}
			}
		}
		return true
	})
	return out
}
