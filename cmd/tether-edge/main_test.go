package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-edge/tether/edgeproxy"
	"github.com/tether-edge/tether/internal/cli"
	"github.com/tether-edge/tether/internal/config"
)

// Every key of the YAML file is a flag of the same name, with help.
func TestEveryConfigKeyIsAFlag(t *testing.T) {
	cfg := edgeproxy.DefaultConfig()
	fs := flag.NewFlagSet("tether-edge", flag.ContinueOnError)
	registerFlags(fs, &cfg)
	if err := cli.CheckFlags(fs, cfg); err != nil {
		t.Error(err)
	}
}

func TestFileAndFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "edge.yaml")
	os.WriteFile(path, []byte("gateway: [gw-a.example, gw-b.example:443]\ncert: /f.pem\nkey: /f.pem\nallow-ports: [10250]\n"), 0o600)
	cfg := edgeproxy.DefaultConfig()
	fs := flag.NewFlagSet("tether-edge", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	registerFlags(fs, &cfg)
	if err := config.Parse(fs, []string{"--config", path, "--allow-ports", "10250,9100"}, &cfg); err != nil {
		t.Fatal(err)
	}
	if strings.Join(cfg.Gateway, " ") != "gw-a.example gw-b.example:443" || cfg.AllowPorts.String() != "10250,9100" || cfg.AdminListen != "127.0.0.1:10267" {
		t.Errorf("config %+v", cfg)
	}
}

func TestExitCodes(t *testing.T) {
	stderr := os.Stderr
	t.Cleanup(func() { os.Stderr = stderr })
	os.Stderr, _ = os.Open(os.DevNull) // usage and errors
	for args, want := range map[string]int{
		"--version":            0,
		"--help":               0,
		"":                     2, // nothing to do
		"--gateway gw.example": 2, // no certificate
		"--log-level loud --gateway gw --cert /x --key /x": 2,
	} {
		if got := run(strings.Fields(args)); got != want {
			t.Errorf("run(%q) = %d, want %d", args, got, want)
		}
	}
}
