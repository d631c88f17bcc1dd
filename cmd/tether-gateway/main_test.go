package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/gateway"
	"github.com/tether-edge/tether/internal/cli"
	"github.com/tether-edge/tether/internal/config"
)

// Every key of the YAML file is a flag of the same name, with help.
func TestEveryConfigKeyIsAFlag(t *testing.T) {
	cfg := gateway.DefaultConfig()
	fs := flagSet(&cfg)
	if err := cli.CheckFlags(fs, cfg); err != nil {
		t.Error(err)
	}
}

func TestFileAndFlags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	os.WriteFile(path, []byte("client-ca: /ca.pem\ntls-cert: /gw.pem\ntls-key: /gw.key\ndns-zone: [tether.internal]\nidle-timeout: 30s\nmode: vip\nvip-cidr: 100.64.0.0/16\nkube-api-qps: 250\nkube-api-burst: 300\n"), 0o600)
	cfg := gateway.DefaultConfig()
	fs := flagSet(&cfg)
	fs.SetOutput(io.Discard)
	if err := config.Parse(fs, []string{"--config", path, "--proxy-port", "10300", "--shutdown-grace=3s", "--kube-api-burst", "400"}, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.ClientCA != "/ca.pem" || strings.Join(cfg.DNSZones, ",") != "tether.internal" || cfg.IdleTimeout.Duration != 30*time.Second ||
		cfg.Mode != "vip" || cfg.ProxyPort != 10300 || cfg.ShutdownGrace.Duration != 3*time.Second || cfg.TunnelListen != ":10262" ||
		cfg.KubeAPIQPS != 250 || cfg.KubeAPIBurst != 400 {
		t.Errorf("config %+v", cfg)
	}
}

// --max-receive-memory takes Kubernetes sizes, in the file and as a
// flag; 0 turns the bound off, a negative size is refused.
func TestMaxReceiveMemory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	os.WriteFile(path, []byte("client-ca: /ca.pem\ntls-cert: /gw.pem\ntls-key: /gw.key\nmax-receive-memory: 64Mi\n"), 0o600)
	for _, tc := range []struct {
		args []string
		want int64
	}{
		{nil, 64 << 20},
		{[]string{"--max-receive-memory", "2Gi"}, 2 << 30},
		{[]string{"--max-receive-memory=0"}, 0},
	} {
		cfg := gateway.DefaultConfig()
		if got := cfg.MaxReceiveMemory.Value(); got != 256<<20 {
			t.Fatalf("default %d, want 256Mi", got)
		}
		fs := flagSet(&cfg)
		fs.SetOutput(io.Discard)
		if err := config.Parse(fs, append([]string{"--config", path}, tc.args...), &cfg); err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if got := cfg.MaxReceiveMemory.Value(); got != tc.want {
			t.Errorf("%q: %d, want %d", tc.args, got, tc.want)
		}
	}
	cfg := gateway.DefaultConfig()
	fs := flagSet(&cfg)
	fs.SetOutput(io.Discard)
	if err := config.Parse(fs, []string{"--config", path, "--max-receive-memory", "-1Gi"}, &cfg); err == nil {
		t.Error("--max-receive-memory -1Gi accepted")
	}
	os.WriteFile(path, []byte("client-ca: /ca.pem\ntls-cert: /gw.pem\ntls-key: /gw.key\nmax-receive-memory: -5Mi\n"), 0o600)
	cfg = gateway.DefaultConfig()
	fs = flagSet(&cfg)
	fs.SetOutput(io.Discard)
	if err := config.Parse(fs, []string{"--config", path}, &cfg); err == nil || !strings.Contains(err.Error(), "--max-receive-memory") {
		t.Errorf("max-receive-memory: -5Mi in the file: %v, want a refusal naming it", err)
	}
}

func TestMemoryLimit(t *testing.T) {
	cfg := gateway.DefaultConfig()
	if cfg.MemoryLimit != cli.AutoMemoryLimit {
		t.Fatalf("default %q, want %q (a share of the cgroup's limit)", cfg.MemoryLimit, cli.AutoMemoryLimit)
	}
	fs := flagSet(&cfg)
	fs.SetOutput(io.Discard)
	if err := config.Parse(fs, []string{"--memory-limit", "900Mi", "--client-ca", "/ca.pem", "--tls-cert", "/gw.pem", "--tls-key", "/gw.key"}, &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.MemoryLimit != "900Mi" {
		t.Errorf("--memory-limit 900Mi: %q", cfg.MemoryLimit)
	}
	for _, bad := range []string{"lots", "-1Gi", "1Ki"} {
		cfg.MemoryLimit = bad
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--memory-limit") {
			t.Errorf("--memory-limit %s: %v, want a refusal naming it", bad, err)
		}
	}
}

func TestExitCodes(t *testing.T) {
	stderr := os.Stderr
	t.Cleanup(func() { os.Stderr = stderr })
	os.Stderr, _ = os.Open(os.DevNull) // usage and errors
	for args, want := range map[string]int{
		"--version": 0,
		"--help":    0,
		"":          2, // no certificates
		"--client-ca /x --tls-cert /x --tls-key /x --log-level loud":                                                                         2,
		"--client-ca /x --tls-cert /x --tls-key /x --mode nat":                                                                               2,
		"--client-ca /nonexistent --tls-cert /nonexistent --tls-key /nonexistent --admin-listen= --proxy-port 0 --tunnel-listen 127.0.0.1:0": 1,
	} {
		if got := run(strings.Fields(args)); got != want {
			t.Errorf("run(%q) = %d, want %d", args, got, want)
		}
	}
}
