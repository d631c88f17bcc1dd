// Command tetherctl shows an operator the state of a Tether installation:
// `tetherctl status` prints the edges connected to one or more
// tether-gateway replicas, read from their admin endpoint's /status;
// `tetherctl ca` prints the CA bundle edges need when the gateways manage
// their own certificates; `tetherctl pools` prints the node pools, from the
// cloud apiserver or from edges' /status; `tetherctl node retire NAME`
// retires a compromised node's identity (internal/retired).
//
// Installed as kubectl-tether too (the packages add that link), it is
// kubectl's plugin: `kubectl tether pools --context prod` runs it with the
// arguments after "tether", and its usage and messages name it
// "kubectl tether".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tether-edge/tether/internal/config"
	"github.com/tether-edge/tether/internal/version"
	"github.com/tether-edge/tether/poolstore/record"
)

// DefaultGateway is the admin address of a gateway on this host
// (docs/design.md, "Ports and names": gateway admin HTTP :10265).
const DefaultGateway = "http://127.0.0.1:10265"

func main() {
	os.Exit(runAs(context.Background(), progName(os.Args[0]), os.Args[1:], os.Stdout, os.Stderr))
}

// PluginName is tetherctl's name as kubectl's plugin: kubectl finds an
// executable kubectl-tether on $PATH and runs it for `kubectl tether`.
const PluginName = "kubectl-tether"

// progName is the name tetherctl's usage and messages give it: "kubectl
// tether" when run as kubectl's plugin, else "tetherctl".
func progName(argv0 string) string {
	if filepath.Base(argv0) == PluginName {
		return "kubectl tether"
	}
	return "tetherctl"
}

// options are tetherctl's flags, shared by every command.
type options struct {
	prog     string // "tetherctl" or "kubectl tether"
	gateways []string
	output   string
	timeout  time.Duration
	dataDir  string
	// pools
	kubeconfig  string
	kubeContext string
	edges       []string
	poolLease   time.Duration
}

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // a gateway, edge or the apiserver failed to answer
	exitUsage = 2
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runAs(ctx, "tetherctl", args, stdout, stderr)
}

// runAs runs tetherctl named prog (see progName).
func runAs(ctx context.Context, prog string, args []string, stdout, stderr io.Writer) int {
	o := options{prog: prog}
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var(config.NewStringList(&o.gateways), "gateway", "admin `URL`s of tether-gateway replicas (comma-separated or repeated; host:port means http://host:port); default $TETHER_GATEWAY or "+DefaultGateway)
	fs.StringVar(&o.output, "o", "table", "output `format`: table, json, or wide (pools: more columns)")
	fs.DurationVar(&o.timeout, "timeout", 5*time.Second, "give up on a gateway, edge or apiserver request that has not been answered within this `duration`")
	fs.StringVar(&o.dataDir, "data-dir", "", "ca: read the CA from this gateway data `directory` (its --data-dir) instead of asking the gateways")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "pools: the cloud apiserver's kubeconfig `file`; default $KUBECONFIG, then ~/.kube/config")
	fs.StringVar(&o.kubeContext, "context", "", "pools: the kubeconfig `context` to use; default its current-context")
	fs.DurationVar(&o.poolLease, "pool-lease-duration", record.DefaultLeaseDuration, "pools: the pools' configured lease `duration` (the edges' and gateways' --pool-lease-duration): an election record's lease counts at most this long, and one written longer is marked")
	fs.Var(config.NewStringList(&o.edges), "edge", "pools: read the admin /status of these tether-edge `URL`s instead of the cloud (comma-separated or repeated; "+
		"host:port means http://host:port, the port defaults to 10267: --edge 127.0.0.1 on an edge node)")
	fs.Usage = func() { usage(fs, prog) }

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
	// Flags and the command's arguments, in any order.
	var cmdArgs []string
	for rest = rest[1:]; ; rest = fs.Args()[1:] {
		if err := fs.Parse(rest); err != nil {
			return usageError(err)
		}
		if fs.NArg() == 0 {
			break
		}
		cmdArgs = append(cmdArgs, fs.Arg(0))
	}
	if len(cmdArgs) > 0 && cmd != "node" {
		fmt.Fprintf(stderr, "%s %s: unexpected arguments %q\n", prog, cmd, cmdArgs)
		return exitUsage
	}
	if o.poolLease < time.Second {
		fmt.Fprintf(stderr, "%s: --pool-lease-duration %v: want at least 1s\n", prog, o.poolLease)
		return exitUsage
	}
	if o.output != "table" && o.output != "json" && o.output != "wide" {
		fmt.Fprintf(stderr, "%s: -o %q: want table, json or wide\n", prog, o.output)
		return exitUsage
	}
	if cmd != "pools" && (o.output == "wide" || len(o.edges) > 0 || (cmd != "node" && (o.kubeconfig != "" || o.kubeContext != ""))) {
		fmt.Fprintf(stderr, "%[1]s %[2]s: -o wide and --edge are for %[1]s pools, --kubeconfig and --context for %[1]s pools and %[1]s node\n", prog, cmd)
		return exitUsage
	}
	if (o.kubeconfig != "" || o.kubeContext != "") && len(o.edges) > 0 {
		fmt.Fprintf(stderr, "%s pools: give --kubeconfig/--context (the cloud's view) or --edge (the edges'), not both\n", prog)
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
	case "node":
		return node(ctx, o, cmdArgs, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "tetherctl", version.Version)
		return exitOK
	case "help":
		fs.SetOutput(stdout)
		fs.Usage()
		return exitOK
	}
	fmt.Fprintf(stderr, "%s: unknown command %q (want status, ca, pools, node, version or help)\n", prog, cmd)
	return exitUsage
}

func usageError(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	return exitUsage
}

func usage(fs *flag.FlagSet, prog string) {
	w := fs.Output()
	fmt.Fprintf(w, "Usage: %s [flags] <command> [flags]\n", prog)
	fmt.Fprint(w, `
Commands:
  status    the edges connected to each gateway replica: node, pool, replica,
            RTT, open streams, bytes relayed, connected since
  ca        the CA bundle edges need as their --gateway-ca when the gateways
            issue their own serving certificates (no --tls-cert): each
            gateway's CA once, PEM. Fetch it over a path you trust
  pools     the node pools, from the cloud apiserver (--kubeconfig,
            --context): for each pool its members, the elected leader and
            its last renewal, the leader's last sync, the members whose
            heartbeats are delegated (openyurt.io/delegate-heartbeat) and
            those tainted node.openyurt.io/unschedulable; -o wide adds the
            members' names.
            With --edge, each edge's replica instead: role, leader, epoch,
            revision, objects, last sync, fresh, replication lag, digest
  node retire NAME
            retire a node's identity, in the cloud apiserver (--kubeconfig,
            --context): its certificates issued until now get no tunnel
            (a live one is closed), kube-apiserver refuses the name's Node
            registrations and certificate requests, and its Node is
            deleted. A machine onboarded under the name later, with a
            certificate issued after the retirement, gets a tunnel
  node unretire NAME
            take the name out of the retired nodes
  node retired
            the retired nodes and when they were retired
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
