package cli

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
)

func TestCheckFlags(t *testing.T) {
	type cfg struct {
		Listen string `json:"listen"`
		Zones  string `json:"zones,omitempty"`
		Short  string `json:"short"`
		Hidden string `json:"-"`
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("listen", "", "listen `address` of the thing, explained")
	fs.String("short", "", "terse")
	err := CheckFlags(fs, cfg{})
	if err == nil {
		t.Fatal("CheckFlags accepted a key without a flag and a terse help")
	}
	for _, want := range []string{`config key "zones" has no flag`, `--short: help "terse" says too little`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "listen") || strings.Contains(err.Error(), "Hidden") {
		t.Errorf("error %q names a documented or hidden key", err)
	}
}

// Main logs with the program's --log-level and --log-format and applies
// its --memory-limit: a bad value of each is a configuration error, found
// before the program runs.
func TestMainReadsProcessFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"--log-level", "debug", "--log-format", "json"}, ExitOK},
		{[]string{"--log-level", "loud"}, ExitConfig},
		{[]string{"--log-format", "xml"}, ExitConfig},
		{[]string{"--memory-limit", "lots"}, ExitConfig},
	} {
		ran := false
		fs := NewFlagSet("t", "/etc/t.yaml")
		fs.SetOutput(io.Discard)
		fs.String("log-level", "info", "log `level`")
		fs.String("log-format", "text", "log `format`")
		fs.String("memory-limit", "0", "memory `limit`")
		code := Main(Program{Name: "t", Flags: fs, Config: noConfig{}, Run: func(context.Context, *slog.Logger) error {
			ran = true
			return nil
		}}, tc.args)
		if code != tc.want || ran != (tc.want == ExitOK) {
			t.Errorf("%q: exit %d, ran %v; want %d", tc.args, code, ran, tc.want)
		}
	}
}

type noConfig struct{}

func (noConfig) Validate() error { return nil }
