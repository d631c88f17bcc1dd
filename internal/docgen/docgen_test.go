package docgen

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

type testConfig struct {
	Listen  string        `json:"listen"`
	Ports   []int         `json:"ports,omitempty"`
	Names   []string      `json:"name,omitempty"`
	Verbose bool          `json:"verbose,omitempty"`
	Timeout time.Duration `json:"-"`
	Added   string        `json:"added,omitempty"`
}

func testFlags() (*flag.FlagSet, testConfig) {
	cfg := testConfig{Listen: ":10262", Ports: []int{10250, 10255}}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("config", "", "read settings from this `file`")
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "UDP `address` to listen on | anywhere")
	fs.Func("ports", "the `ports` (comma-separated)", func(string) error { return nil })
	fs.Func("name", "DNS `names` such as <node>.example, *.example", func(string) error { return nil })
	fs.BoolVar(&cfg.Verbose, "verbose", false, "log more")
	fs.StringVar(&cfg.Added, "added", "", "a `setting` no section names")
	return fs, cfg
}

func TestFlagsAndTable(t *testing.T) {
	fs, cfg := testFlags()
	flags, err := Flags(fs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range flags {
		names = append(names, f.Name)
	}
	// --config is no key: first; then the keys in the struct's order.
	if got := strings.Join(names, " "); got != "config listen ports name verbose added" {
		t.Errorf("order %q", got)
	}
	table := FlagTable(flags)
	for _, want := range []string{
		"| `--listen address` | `:10262` | UDP address to listen on \\| anywhere |",
		"| `--name names` |  | DNS names such as \\<node>.example, \\*.example |",
		"| `--verbose` |  | log more |",
	} {
		if !strings.Contains(table, want+"\n") {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}

	fs.String("stray", "", "a flag whose key is missing")
	type noFlag struct {
		Missing string `json:"missing"`
	}
	if _, err := Flags(fs, noFlag{}); err == nil || !strings.Contains(err.Error(), `"missing" has no flag`) {
		t.Errorf("a key without a flag: %v", err)
	}
}

func TestConfigFile(t *testing.T) {
	fs, cfg := testFlags()
	flags, err := Flags(fs, cfg)
	if err != nil {
		t.Fatal(err)
	}
	file, err := ConfigFile("# header", []Section{{Heading: "Main", Keys: []string{"listen", "ports", "name", "verbose"}}}, "Other",
		flags, map[string]string{"name": "[a.example]"}, map[string]string{"listen": "Keep it private."})
	if err != nil {
		t.Fatal(err)
	}
	want := `# header

## Main

# UDP address to listen on | anywhere. Keep it private.
# listen: ":10262"

# The ports (comma-separated).
# ports: [10250, 10255]

# DNS names such as <node>.example, *.example.
# name: [a.example]

# Log more.
# verbose: false

## Other

# A setting no section names.
# added: <setting>
`
	if file != want {
		t.Errorf("config file:\n%s\nwant:\n%s", file, want)
	}
	// Uncommented, every key is YAML of the right shape.
	var got testConfig
	if err := yaml.UnmarshalStrict(Uncommented([]byte(file), flags), &got); err != nil {
		t.Fatal(err)
	}
	if got.Listen != ":10262" || len(got.Ports) != 2 || got.Names[0] != "a.example" || got.Added != "<setting>" {
		t.Errorf("uncommented: %+v", got)
	}

	// A help that wraps into "word: ..." would read as a key.
	long := strings.Repeat("a", 71) + " from: the VPC's." // "from:" starts the third line
	if _, err := ConfigFile("", nil, "Other", flags, nil, map[string]string{"listen": long}); err == nil ||
		!strings.Contains(err.Error(), `reads as a key`) {
		t.Errorf("a help line that reads as a key: %v", err)
	}

	if _, err := ConfigFile("", []Section{{Heading: "Main", Keys: []string{"gone"}}}, "", flags, map[string]string{"old": "x"}, nil); err == nil ||
		!strings.Contains(err.Error(), `"gone" is no config key`) || !strings.Contains(err.Error(), `for "old"`) {
		t.Errorf("unknown keys: %v", err)
	}
}

func TestYAMLValue(t *testing.T) {
	for _, c := range []struct {
		v    any
		want string
	}{
		{":53", `":53"`},
		{"127.0.0.1:10261", "127.0.0.1:10261"},
		{"", ""},
		{"yes", `"yes"`},
		{float64(100), "100"},
		{true, "true"},
		{[]any{"a", "b,c"}, `[a, "b,c"]`},
		{[]any{}, ""},
	} {
		if got := YAMLValue(c.v); got != c.want {
			t.Errorf("YAMLValue(%#v) = %s, want %s", c.v, got, c.want)
		}
	}
}

func TestRegions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "README.md")
	doc := "# Title\n\nhand-written\n\n<!-- BEGIN GENERATED: x -->\nold\n<!-- END GENERATED: x -->\n\nmore\n"
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	err := UpdateRegion(path, "x", "new\n", false)
	if err == nil || !strings.Contains(err.Error(), "make generate") || !strings.Contains(err.Error(), `line 6 is "old"`) {
		t.Errorf("a stale region: %v", err)
	}
	if err := UpdateRegion(path, "x", "new\n", true); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != strings.Replace(doc, "old", "new", 1) {
		t.Errorf("updated:\n%s", b)
	}
	if err := UpdateRegion(path, "x", "new", false); err != nil {
		t.Errorf("an up-to-date region: %v", err)
	}
	if err := UpdateRegion(path, "y", "new", true); err == nil || !strings.Contains(err.Error(), "BEGIN GENERATED: y") {
		t.Errorf("no markers: %v", err)
	}
}
