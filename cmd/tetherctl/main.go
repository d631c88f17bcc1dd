// Command tetherctl shows an operator the state of a Tether installation:
// `tetherctl status` prints the edges connected to one or more
// tether-gateway replicas, read from their admin endpoint's /status;
// `tetherctl ca` prints the CA bundle edges need when the gateways manage
// their own certificates; `tetherctl pools` prints the node pools, from the
// cloud apiserver or from edges' /status.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/tether-edge/tether/internal/config"
	"github.com/tether-edge/tether/internal/version"
)

// DefaultGateway is the admin address of a gateway on this host
// (DESIGN.md: gateway admin HTTP :10265).
const DefaultGateway = "http://127.0.0.1:10265"

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// options are tetherctl's flags, shared by every command.
type options struct {
	gateways []string
	output   string
	timeout  time.Duration
	dataDir  string
	// pools
	kubeconfig string
	edges      []string
}

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // a gateway, edge or the apiserver failed to answer
	exitUsage = 2
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var o options
	fs := flag.NewFlagSet("tetherctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var(config.NewStringList(&o.gateways), "gateway", "admin `URL`s of tether-gateway replicas (comma-separated or repeated; host:port means http://host:port); default $TETHER_GATEWAY or "+DefaultGateway)
	fs.StringVar(&o.output, "o", "table", "output `format`: table, json, or wide (pools: more columns)")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Second, "give up on a gateway, edge or apiserver request that has not been answered within this `duration`")
	fs.StringVar(&o.dataDir, "data-dir", "", "ca: read the CA from this gateway data `directory` (its --data-dir) instead of asking the gateways")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "pools: the cloud apiserver's kubeconfig `file`; default $KUBECONFIG, then ~/.kube/config")
	fs.Var(config.NewStringList(&o.edges), "edge", "pools: read the admin /status of these tether-edge `URL`s instead of the cloud (comma-separated or repeated; "+
		"host:port means http://host:port, the port defaults to 10267: --edge 127.0.0.1 on an edge node)")
	fs.Usage = func() { usage(fs) }

	// Flags may come before and after the command: parse, take the
	// command, parse the rest.
	if err := fs.Parse(args); err != nil {
		return usageError(err)
	}
	rest := fs.Args()
	if len(rest) == 0 {
		fs.Usage()
		return exitUsage
	}
	cmd := rest[0]
	if err := fs.Parse(rest[1:]); err != nil {
		return usageError(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "tetherctl %s: unexpected arguments %q\n", cmd, fs.Args())
		return exitUsage
	}
	if o.output != "table" && o.output != "json" && o.output != "wide" {
		fmt.Fprintf(stderr, "tetherctl: -o %q: want table, json or wide\n", o.output)
		return exitUsage
	}
	if cmd != "pools" && (o.output == "wide" || o.kubeconfig != "" || len(o.edges) > 0) {
		fmt.Fprintf(stderr, "tetherctl %s: -o wide, --kubeconfig and --edge are for tetherctl pools\n", cmd)
		return exitUsage
	}
	if o.kubeconfig != "" && len(o.edges) > 0 {
		fmt.Fprintln(stderr, "tetherctl pools: give --kubeconfig (the cloud's view) or --edge (the edges'), not both")
		return exitUsage
	}
	if len(o.gateways) == 0 {
		o.gateways = []string{DefaultGateway}
		if env := os.Getenv("TETHER_GATEWAY"); env != "" {
			o.gateways = strings.Split(env, ",")
		}
	}

	switch cmd {
	case "status":
		return status(ctx, o, stdout, stderr)
	case "ca":
		return ca(ctx, o, stdout, stderr)
	case "pools":
		return pools(ctx, o, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "tetherctl", version.Version)
		return exitOK
	case "help":
		fs.SetOutput(stdout)
		fs.Usage()
		return exitOK
	}
	fmt.Fprintf(stderr, "tetherctl: unknown command %q (want status, ca, pools, version or help)\n", cmd)
	return exitUsage
}

func usageError(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	return exitUsage
}

func usage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprint(w, `Usage: tetherctl [flags] <command> [flags]

Commands:
  status    the edges connected to each gateway replica: node, pool, replica,
            RTT, open streams, bytes relayed, connected since
  ca        the CA bundle edges need as their --gateway-ca when the gateways
            issue their own serving certificates (no --tls-cert): each
            gateway's CA once, PEM. Fetch it over a path you trust
  pools     the node pools, from the cloud apiserver (--kubeconfig): for each
            pool its members, the elected leader and its last renewal, the
            leader's last sync, the members whose heartbeats are delegated
            (openyurt.io/delegate-heartbeat) and those tainted
            node.openyurt.io/unschedulable; -o wide adds the members' names.
            With --edge, each edge's replica instead: role, leader, epoch,
            revision, objects, last sync, fresh, replication lag, digest
  version   print tetherctl's version

Flags:
`)
	fs.VisitAll(func(f *flag.Flag) {
		name, help := flag.UnquoteUsage(f)
		fmt.Fprintf(w, "  -%s %s\n      %s", f.Name, name, help)
		if f.DefValue != "" && f.DefValue != "[]" {
			fmt.Fprintf(w, " (default %s)", f.DefValue)
		}
		fmt.Fprintln(w)
	})
}
