// Command tether-edge runs on every edge node: it keeps the QUIC tunnel to
// the tether-gateway replicas, through which cloud clients reach this
// node's own ports (kubelet :10250 and others on the allow list).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/tether-edge/tether/edgeproxy"
	"github.com/tether-edge/tether/internal/config"
	"github.com/tether-edge/tether/internal/logging"
	"github.com/tether-edge/tether/internal/version"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cfg := edgeproxy.DefaultConfig()
	fs := flag.NewFlagSet("tether-edge", flag.ContinueOnError)
	showVersion := registerFlags(fs, &cfg)

	err := config.Parse(fs, args, &cfg)
	if *showVersion {
		fmt.Println("tether-edge", version.Version)
		return 0
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether-edge:", err)
		return 2
	}
	log, err := logging.New(cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tether-edge:", err)
		return 2
	}
	cfg.Logger = log

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := edgeproxy.Run(ctx, cfg); err != nil {
		log.Error("tether-edge failed", "err", err)
		return 1
	}
	return 0
}

func registerFlags(fs *flag.FlagSet, cfg *edgeproxy.Config) (showVersion *bool) {
	fs.String(config.FlagName, "", "read settings from this YAML `file` first (keys are these flag names; unknown keys are an error); flags on the command line override it. The packages pass /etc/tether/edge.yaml")
	fs.Var(config.NewStringList(&cfg.Gateway), "gateway", "the tether-gateway replicas, `host:port,...`: addresses and/or DNS names (port 10262 when none is given). A name is resolved every 30 s to all its addresses, and the edge keeps one QUIC connection to each. Without --gateway there is nothing to do yet")
	fs.StringVar(&cfg.GatewayCA, "gateway-ca", cfg.GatewayCA, "PEM `file` with the CA certificate(s) that verify the gateways' certificates (default: the system's roots)")
	fs.StringVar(&cfg.GatewayServerName, "gateway-server-name", cfg.GatewayServerName, "`name` the gateways' certificates must hold (default: the host part of each --gateway entry)")
	fs.StringVar(&cfg.Cert, "cert", cfg.Cert, "PEM `file` with this node's client certificate (CN=system:node:<name>, O=system:nodes), such as the kubelet's /var/lib/kubelet/pki/kubelet-client-current.pem; read again when it changes, for new connections")
	fs.StringVar(&cfg.Key, "key", cfg.Key, "PEM `file` with the private key of --cert; may be the same file as --cert")
	fs.Var(&cfg.AllowPorts, "allow-ports", "the only `ports` (comma-separated) of this node, on its own addresses and loopback, that cloud clients may reach through the tunnel")
	fs.IntVar(&cfg.MaxStreams, "max-streams", cfg.MaxStreams, "at most `n` connections relayed at once; more are refused as overloaded")
	fs.StringVar(&cfg.NodeName, "node-name", cfg.NodeName, "`name` of this node (default: the one in the client certificate); the gateway always knows the edge by its certificate")
	fs.StringVar(&cfg.Kubeconfig, "kubeconfig", cfg.Kubeconfig, "kubeconfig `file` for the cloud kube-apiserver, used by the apiserver proxy (not in this build yet)")
	fs.Var(config.NewStringList(&cfg.ServerAddr), "server-addr", "the cloud kube-apiservers, `https://host:port,...`, reached with --cert/--key by the apiserver proxy (not in this build yet)")
	fs.StringVar(&cfg.APIServerListen, "apiserver-listen", cfg.APIServerListen, "listen `address` of the kube-apiserver proxy for kubelet, kube-proxy and coredns (not in this build yet)")
	fs.StringVar(&cfg.AdminListen, "admin-listen", cfg.AdminListen, "listen `address` of the admin HTTP endpoints /metrics, /healthz, /readyz (a gateway connected) and /status (JSON); empty disables them")
	fs.StringVar(&cfg.Pool, "pool", cfg.Pool, "`name` of this node's pool (default: its apps.openyurt.io/nodepool label; not in this build yet)")
	fs.StringVar(&cfg.PoolListen, "pool-listen", cfg.PoolListen, "listen `address` of the pool listener on the node LAN (not in this build yet)")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "state `directory` (not used by this build yet)")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "log `level`: debug, info, warn or error (debug also logs every refused stream)")
	fs.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "log `format`: text or json")
	showVersion = fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() { usage(fs) }
	return showVersion
}

func usage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprint(w, `Usage: tether-edge [flags]

tether-edge runs on an edge node behind NAT. It dials out to every
tether-gateway replica over QUIC (mutual TLS with this node's client
certificate) and serves the connections the gateways open for cloud clients
(kube-apiserver, metrics-server, Prometheus) by dialling this node's own
ports, if --allow-ports allows them. TLS stays end to end.

Flags:
`)
	fs.VisitAll(func(f *flag.Flag) {
		name, help := flag.UnquoteUsage(f)
		fmt.Fprintf(w, "  --%s", f.Name)
		if name != "" {
			fmt.Fprintf(w, " %s", name)
		}
		fmt.Fprintf(w, "\n      %s", strings.ReplaceAll(help, "\n", "\n      "))
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}
