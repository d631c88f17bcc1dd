// Command tether-gateway runs in the cloud: edge nodes behind NAT dial it
// over QUIC, and it relays cloud clients' TCP connections for those nodes
// through their tunnels, TLS untouched.
package main

import (
	"context"
	"flag"
	"log/slog"
	"os"

	"github.com/tether-edge/tether/gateway"
	"github.com/tether-edge/tether/internal/cli"
)

// docs/reference/flags.md's tether-gateway table and
// packaging/config/gateway.yaml are generated from the flags
// (gateway.Config.RegisterFlags) by TestGeneratedDocsUpToDate (docs_test.go),
// which fails when they differ.
//go:generate go test -count=1 -run TestGeneratedDocsUpToDate . -args -update

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cfg := gateway.DefaultConfig()
	return cli.Main(cli.Program{
		Name:   "tether-gateway",
		Intro:  intro,
		Flags:  flagSet(&cfg),
		Config: &cfg,
		Run: func(ctx context.Context, log *slog.Logger) error {
			cfg.Logger = log
			return gateway.Run(ctx, cfg)
		},
	}, args)
}

// flagSet is tether-gateway's flags, bound to cfg: --config and the
// settings.
func flagSet(cfg *gateway.Config) *flag.FlagSet {
	fs := cli.NewFlagSet("tether-gateway", "/etc/tether/gateway.yaml")
	cfg.RegisterFlags(fs)
	return fs
}

const intro = `
tether-gateway runs in the cloud. Edge nodes behind NAT dial it over QUIC
(mutual TLS; an edge is known by the node name in its client certificate).
It watches the cluster's Nodes, and relays each TCP connection that cloud
clients (kube-apiserver, metrics-server, Prometheus) open to an edge node's
address over its own stream in that node's tunnel. TLS stays end to end.

`
