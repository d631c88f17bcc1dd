// Package docgen writes the parts of the documentation that the code
// already says: the flag and metric tables of docs/reference (flags.md,
// metrics.md) and the commented configuration files in packaging/config,
// from the programs' flag sets, their config structs and their metric
// registrations. The programs' tests
// (TestGeneratedDocsUpToDate, and packaging's TestMetricNames for the
// metrics) render them and compare with the files; `make generate` (go
// generate ./...) runs the same tests with -update to write them. So the
// text that is checked is the text that is written, and a flag or metric
// added without its documentation fails CI.
//
// A generated region of a Markdown file lies between
//
//	<!-- BEGIN GENERATED: name -->
//	<!-- END GENERATED: name -->
//
// and everything around it stays hand-written.
package docgen

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"sigs.k8s.io/yaml"
)

// Flag is one flag of a program as --help shows it.
type Flag struct {
	Name string
	// Arg is the name of its value (the back-quoted word of its help;
	// "" for a boolean).
	Arg string
	// Usage is its help, without the back quotes.
	Usage string
	// Default is the default --help shows ("" for none).
	Default string
	// Key reports whether it is also a key of the config file.
	Key bool
	// Value is the config key's default as YAML ("" for none).
	Value string
}

// Flags lists the flags of fs: those that are no config key first (such
// as --config), then the config keys in the order of cfg's struct fields
// (cfg holds the defaults; its json tags are the keys).
func Flags(fs *flag.FlagSet, cfg any) ([]Flag, error) {
	defaults, err := yamlDefaults(cfg)
	if err != nil {
		return nil, err
	}
	var keys []string
	typ := reflect.TypeOf(cfg)
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	var out []Flag
	fs.VisitAll(func(f *flag.Flag) {
		if !slices.Contains(keys, f.Name) {
			out = append(out, newFlag(f, defaults))
		}
	})
	var errs []error
	for _, k := range keys {
		f := fs.Lookup(k)
		if f == nil {
			errs = append(errs, fmt.Errorf("config key %q has no flag", k))
			continue
		}
		out = append(out, newFlag(f, defaults))
	}
	return out, errors.Join(errs...)
}

func newFlag(f *flag.Flag, defaults map[string]string) Flag {
	arg, usage := flag.UnquoteUsage(f)
	def := f.DefValue
	if def == "false" || def == "0" {
		def = "" // as cli.Usage shows them
	}
	v, key := defaults[f.Name]
	return Flag{Name: f.Name, Arg: arg, Usage: usage, Default: def, Key: key, Value: v}
}

// yamlDefaults is each key of cfg's YAML form with its value as YAML
// ("" when cfg leaves it out or empty).
func yamlDefaults(cfg any) (map[string]string, error) {
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	out := map[string]string{}
	typ := reflect.TypeOf(cfg)
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		out[name] = ""
		if v, ok := m[name]; ok {
			out[name] = YAMLValue(v)
		}
	}
	return out, nil
}

// YAMLValue writes v (a JSON value) as a one-line YAML value: lists in
// flow style, strings quoted only where YAML needs it; "" for an empty
// string or list.
func YAMLValue(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		if v == "" {
			return ""
		}
		b, err := yaml.Marshal(v)
		s := strings.TrimSpace(string(b))
		// Quoted where YAML would quote it, and where a reader might
		// wonder: a leading indicator (":53").
		if err != nil || strings.HasPrefix(s, "'") || strings.Contains(s, "\n") || strings.ContainsRune(":-?,[]{}#&*!|>%@`", rune(v[0])) {
			q, _ := json.Marshal(v) // a JSON string is a YAML string
			return string(q)
		}
		return s
	case []any:
		if len(v) == 0 {
			return ""
		}
		items := make([]string, len(v))
		for i, item := range v {
			items[i] = YAMLValue(item)
			if strings.ContainsAny(items[i], ",[]{}") && !strings.HasPrefix(items[i], `"`) {
				q, _ := json.Marshal(item)
				items[i] = string(q)
			}
		}
		return "[" + strings.Join(items, ", ") + "]"
	default:
		b, _ := json.Marshal(v)
		return string(b)
	}
}

// FlagTable is a Markdown table of flags: flag, default, meaning.
func FlagTable(flags []Flag) string {
	var b strings.Builder
	b.WriteString("| flag | default | meaning |\n|---|---|---|\n")
	for _, f := range flags {
		name := "--" + f.Name
		if f.Arg != "" {
			name += " " + f.Arg
		}
		def := ""
		if f.Default != "" {
			def = code(f.Default)
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", code(name), def, cell(f.Usage))
	}
	return b.String()
}

// Metric is one metric family a program exports.
type Metric struct {
	Name   string
	Type   string // counter, gauge, histogram, summary
	Labels []string
	Help   string
}

// MetricSection is the metrics of one program.
type MetricSection struct {
	Program string
	Metrics []Metric
}

// MetricTable is a Markdown table of metrics, a bold row naming each
// program before its metrics (sorted by name): metric, type, labels,
// meaning.
func MetricTable(sections []MetricSection) string {
	var b strings.Builder
	b.WriteString("| metric | type | labels | meaning |\n|---|---|---|---|\n")
	for _, s := range sections {
		fmt.Fprintf(&b, "| **%s** | | | |\n", s.Program)
		ms := slices.Clone(s.Metrics)
		sort.Slice(ms, func(i, j int) bool { return ms[i].Name < ms[j].Name })
		for _, m := range ms {
			labels := make([]string, len(m.Labels))
			for i, l := range m.Labels {
				labels[i] = code(l)
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", code(m.Name), m.Type, strings.Join(labels, ", "), cell(m.Help))
		}
	}
	return b.String()
}

// code is s in Markdown back quotes.
func code(s string) string {
	if strings.Contains(s, "`") {
		return "`` " + strings.ReplaceAll(s, "|", `\|`) + " ``"
	}
	return "`" + strings.ReplaceAll(s, "|", `\|`) + "`"
}

// cell is s fit for a Markdown table cell: one line, pipes escaped, and
// outside code spans the characters Markdown would take for HTML or
// emphasis ("<name>", "*") too.
func cell(s string) string {
	parts := strings.Split(strings.Join(strings.Fields(s), " "), "`")
	for i := range parts {
		if i%2 == 0 || i == len(parts)-1 {
			parts[i] = strings.NewReplacer("<", `\<`, "*", `\*`).Replace(parts[i])
		}
	}
	return strings.ReplaceAll(strings.Join(parts, "`"), "|", `\|`)
}

// sentence is s with a capital first letter and a final period.
func sentence(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return s
	}
	r := []rune(s)
	if r[0] >= 'a' && r[0] <= 'z' {
		r[0] -= 'a' - 'A'
	}
	if !strings.ContainsRune(".!?", r[len(r)-1]) {
		r = append(r, '.')
	}
	return string(r)
}

// Section groups config keys under a heading in a config file.
type Section struct {
	Heading string
	Keys    []string
}

// ConfigFile is a commented-out YAML config file: header (comment lines,
// as written), then per section its heading and for each key its help as
// a comment and "# key: value", value being examples[key], else the
// key's default, else the flag's argument name in angle brackets; notes
// add to a key's help what matters in the file (where a file is kept).
// Keys
// that no section names follow under rest, in the order of flags; a
// section's key that is no flag is an error.
func ConfigFile(header string, sections []Section, rest string, flags []Flag, examples, notes map[string]string) (string, error) {
	byName := map[string]Flag{}
	for _, f := range flags {
		if f.Key {
			byName[f.Name] = f
		}
	}
	var errs []error
	placed := map[string]bool{}
	for _, s := range sections {
		for _, k := range s.Keys {
			if _, ok := byName[k]; !ok {
				errs = append(errs, fmt.Errorf("section %q: %q is no config key", s.Heading, k))
			}
			placed[k] = true
		}
	}
	for _, m := range []map[string]string{examples, notes} {
		for k := range m {
			if _, ok := byName[k]; !ok {
				errs = append(errs, fmt.Errorf("example or note for %q, which is no config key", k))
			}
		}
	}
	var left []string
	for _, f := range flags {
		if f.Key && !placed[f.Name] {
			left = append(left, f.Name)
		}
	}
	if len(left) > 0 {
		sections = append(slices.Clone(sections), Section{Heading: rest, Keys: left})
	}

	var b strings.Builder
	b.WriteString(strings.TrimSpace(header) + "\n")
	for _, s := range sections {
		if s.Heading != "" {
			fmt.Fprintf(&b, "\n## %s\n", s.Heading)
		}
		for _, k := range s.Keys {
			f, ok := byName[k]
			if !ok {
				continue
			}
			b.WriteString("\n")
			for _, line := range wrap(sentence(f.Usage)+" "+notes[k], 76) {
				if keyLike.MatchString(line) {
					errs = append(errs, fmt.Errorf("the help of %q wraps into a line that reads as a key once uncommented: %q; reword it", k, line))
				}
				b.WriteString("# " + line + "\n")
			}
			v, example := examples[k]
			switch {
			case example && f.Value != "" && v != f.Value:
				fmt.Fprintf(&b, "# Default: %s\n", f.Value)
			case !example && f.Value != "":
				v = f.Value
			case !example && f.Arg == "":
				v = "false"
			case !example:
				v = "<" + f.Arg + ">"
			}
			fmt.Fprintf(&b, "# %s: %s\n", k, v)
		}
	}
	return b.String(), errors.Join(errs...)
}

// keyLike is a comment line that, uncommented, reads as a YAML key: an
// operator uncommenting a block, or a check that lists the file's keys,
// would take it for one.
var keyLike = regexp.MustCompile(`^[A-Za-z0-9_.-]+:(\s|$)`)

// wrap breaks s into lines of at most width runes where it can.
func wrap(s string, width int) []string {
	var lines []string
	var line string
	for _, w := range strings.Fields(s) {
		if line != "" && len([]rune(line))+1+len([]rune(w)) > width {
			lines = append(lines, line)
			line = ""
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	if line != "" {
		lines = append(lines, line)
	}
	return lines
}

// Markers of a generated region named name.
func Markers(name string) (begin, end string) {
	return "<!-- BEGIN GENERATED: " + name + " -->", "<!-- END GENERATED: " + name + " -->"
}

// Replace returns doc with the generated region name holding content; the
// markers must be there, once each, on lines of their own.
func Replace(doc []byte, name, content string) ([]byte, error) {
	begin, end := Markers(name)
	i := bytes.Index(doc, []byte(begin+"\n"))
	j := bytes.Index(doc, []byte("\n"+end))
	if i < 0 || j < 0 || j < i || bytes.Count(doc, []byte(begin)) != 1 || bytes.Count(doc, []byte(end)) != 1 {
		return nil, fmt.Errorf("want the markers %q and %q once each, in that order, on lines of their own", begin, end)
	}
	var out bytes.Buffer
	out.Write(doc[:i+len(begin)+1])
	out.WriteString(strings.TrimRight(content, "\n"))
	out.Write(doc[j:])
	return out.Bytes(), nil
}

// Update is how a test keeps a generated file: with update it writes
// want to path (when different); without, it reports whether path holds
// want, and if not, the first line that differs and how to fix it.
func Update(path string, want []byte, update bool) error {
	have, err := os.ReadFile(path)
	if err != nil && !(update && errors.Is(err, os.ErrNotExist)) {
		return err
	}
	if bytes.Equal(have, want) {
		return nil
	}
	if update {
		return os.WriteFile(path, want, 0o644)
	}
	return fmt.Errorf("%s is out of date with the code (%s): run `make generate` (go generate ./...) and commit the result", repoPath(path), firstDifference(have, want))
}

// UpdateRegion is Update for the generated region name of the Markdown
// file path.
func UpdateRegion(path, name, content string, update bool) error {
	have, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	want, err := Replace(have, name, content)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := Update(path, want, update); err != nil {
		return fmt.Errorf("generated region %q: %w", name, err)
	}
	return nil
}

// repoPath is path as the repository names it: the tests give paths
// relative to their package ("../../README.md").
func repoPath(path string) string {
	path = filepath.Clean(path)
	for strings.HasPrefix(path, "../") {
		path = path[len("../"):]
	}
	return path
}

// firstDifference names the first line where have and want differ.
func firstDifference(have, want []byte) string {
	h := strings.Split(string(have), "\n")
	w := strings.Split(string(want), "\n")
	for i := 0; i < len(h) || i < len(w); i++ {
		var hl, wl string
		if i < len(h) {
			hl = h[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if hl != wl {
			// From a little before the first byte that differs.
			p := 0
			for p < len(hl) && p < len(wl) && hl[p] == wl[p] {
				p++
			}
			from := max(0, p-40)
			for from > 0 && !utf8.RuneStart(hl[from]) {
				from--
			}
			return fmt.Sprintf("line %d is %q, the code says %q", i+1, clip(hl[from:], from > 0), clip(wl[from:], from > 0))
		}
	}
	return "they differ"
}

// clip shortens s to about 120 bytes, marking what it left out.
func clip(s string, cutBefore bool) string {
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	if cutBefore {
		s = "..." + s
	}
	return s
}

// Program is what Generate writes for one program.
type Program struct {
	Name string
	// Flags are the program's flags, bound to Config (its defaults).
	Flags  *flag.FlagSet
	Config any
	// README is the Markdown file whose region "<Name> flags" gets the
	// flag table (docs/reference/flags.md).
	README string
	// ConfigFile is the commented config file, made of ConfigHeader,
	// Sections (keys in no section follow under Rest), Examples and Notes.
	ConfigFile   string
	ConfigHeader string
	Sections     []Section
	Rest         string
	Examples     map[string]string
	Notes        map[string]string
}

// Generate writes (update) or checks the program's flag table and config
// file.
func (p Program) Generate(update bool) error {
	flags, err := Flags(p.Flags, p.Config)
	if err != nil {
		return err
	}
	file, err := ConfigFile(p.ConfigHeader, p.Sections, p.Rest, flags, p.Examples, p.Notes)
	if err != nil {
		return fmt.Errorf("%s: %w", p.ConfigFile, err)
	}
	return errors.Join(
		UpdateRegion(p.README, p.Name+" flags", FlagTable(flags), update),
		Update(p.ConfigFile, []byte(file), update),
	)
}

// Uncommented is a config file that ConfigFile wrote with every key's
// line ("# key: value") uncommented: what an operator gets who sets them
// all as shown.
func Uncommented(file []byte, flags []Flag) []byte {
	keys := map[string]bool{}
	for _, f := range flags {
		keys[f.Name] = f.Key
	}
	lines := strings.Split(string(file), "\n")
	for i, l := range lines {
		rest, ok := strings.CutPrefix(l, "# ")
		key, _, found := strings.Cut(rest, ": ")
		if ok && found && keys[key] {
			lines[i] = rest
		}
	}
	return []byte(strings.Join(lines, "\n"))
}

// CheckConfigLoads has load read the program's config file twice, each
// time written into dir: as it is, and Uncommented (every key set as
// shown). It returns what load refused, naming the file and the variant.
func (p Program) CheckConfigLoads(flags []Flag, dir string, load func(path string) error) error {
	file, err := os.ReadFile(p.ConfigFile)
	if err != nil {
		return err
	}
	path := filepath.Join(dir, filepath.Base(p.ConfigFile))
	var errs []error
	for _, v := range []struct {
		name string
		data []byte
	}{{"as shipped", file}, {"every key uncommented", Uncommented(file, flags)}} {
		if err := os.WriteFile(path, v.data, 0o600); err != nil {
			return err
		}
		if err := load(path); err != nil {
			errs = append(errs, fmt.Errorf("%s, %s: %w", p.ConfigFile, v.name, err))
		}
	}
	return errors.Join(errs...)
}
