package cli

import (
	"flag"
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
