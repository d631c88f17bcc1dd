package config

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

type testConfig struct {
	Listen string   `json:"listen"`
	Zones  []string `json:"zones"`
	Port   int      `json:"port"`
	Config string   `json:"-"`
}

func (c *testConfig) Validate() error {
	if c.Port < 0 {
		return errors.New("port must not be negative")
	}
	return nil
}

func parse(t *testing.T, file string, args ...string) (*testConfig, error) {
	t.Helper()
	cfg := &testConfig{Listen: ":1", Port: 7, Zones: []string{"default."}}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(new(strings.Builder))
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "")
	fs.IntVar(&cfg.Port, "port", cfg.Port, "")
	fs.Var(NewStringList(&cfg.Zones), "zones", "")
	fs.StringVar(&cfg.Config, "config", "", "")
	if file != "" {
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append([]string{"--config", path}, args...)
	}
	return cfg, Parse(fs, args, cfg)
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		args       []string
		want       testConfig
	}{
		{"defaults", "", nil, testConfig{Listen: ":1", Port: 7, Zones: []string{"default."}}},
		{"file", "listen: \":2\"\nzones: [a., b.]\n", nil, testConfig{Listen: ":2", Port: 7, Zones: []string{"a.", "b."}}},
		{"flag overrides file", "listen: \":2\"\nport: 9\n", []string{"--listen=:3"}, testConfig{Listen: ":3", Port: 9, Zones: []string{"default."}}},
		{"list flag replaces file list", "zones: [a.]\n", []string{"--zones", "x.,y.", "--zones", "z."}, testConfig{Listen: ":1", Port: 7, Zones: []string{"x.", "y.", "z."}}},
		{"empty file", "\n", nil, testConfig{Listen: ":1", Port: 7, Zones: []string{"default."}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parse(t, tc.file, tc.args...)
			if err != nil {
				t.Fatal(err)
			}
			got.Config = ""
			if diff := cmp.Diff(tc.want, *got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		args       []string
		wantErr    string
	}{
		{"unknown key", "listne: x\n", nil, "unknown field"},
		{"wrong type", "port: many\n", nil, "port"},
		{"validate", "port: -1\n", nil, "invalid configuration: port must not be negative"},
		{"stray argument", "", []string{"extra"}, "unexpected arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(t, tc.file, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	if _, err := parse(t, "", "--config", "/nonexistent/tether.yaml"); err == nil || !strings.Contains(err.Error(), "read config file") {
		t.Errorf("missing file: err = %v", err)
	}
}

func TestFindConfigFlag(t *testing.T) {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.String("listen", "", "")
	fs.Bool("debug", false, "")
	for args, want := range map[string]string{
		"--listen :3 --config /f":       "/f",
		"--debug --config /g":           "/g",
		"--listen --config --config /h": "/h",
		"--config=/a":                   "/a",
		"-config /b":                    "/b",
		"--x=1 --config /c":             "/c",
		"--x=1 -- --config /d":          "",
		"positional --config /e":        "",
	} {
		got, err := findConfigFlag(fs, strings.Fields(args))
		if err != nil || got != want {
			t.Errorf("findConfigFlag(%q) = %q, %v; want %q", args, got, err, want)
		}
	}
}
