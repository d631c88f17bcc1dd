// Command dnsbench is the server side of tools/bench-dns.sh: it generates
// the node names the benchmark queries (as a CoreDNS hosts file and a
// dnsperf query file) and serves them with the gateway's DNS server.
//
//	dnsbench gen -nodes 10000 -zone tether.internal. -hosts H -queries Q
//	dnsbench serve -nodes 10000 -zone tether.internal. -listen 127.0.0.1:5300
//
// Both subcommands derive the same nodes from -nodes, so the two servers
// of a benchmark run answer the same names with the same addresses.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"

	"github.com/tether-edge/tether/gateway/dns"
	"github.com/tether-edge/tether/gateway/nodewatch"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dnsbench gen|serve [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	n := fs.Int("nodes", 10000, "number of edge nodes")
	zone := fs.String("zone", "tether.internal.", "zone the names are in")
	hosts := fs.String("hosts", "", "gen: write a hosts file for CoreDNS here")
	queries := fs.String("queries", "", "gen: write a dnsperf query file here")
	listen := fs.String("listen", "127.0.0.1:5300", "serve: UDP and TCP address")
	fs.Parse(os.Args[2:])

	var err error
	switch os.Args[1] {
	case "gen":
		err = gen(*n, *zone, *hosts, *queries)
	case "serve":
		err = serve(*n, *zone, *listen)
	default:
		err = fmt.Errorf("unknown subcommand %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dnsbench:", err)
		os.Exit(1)
	}
}

// nodes returns n edge nodes, edge-00000 to edge-<n-1>, each with one
// address in 10.0.0.0/8.
func nodes(n int) []nodewatch.Node {
	out := make([]nodewatch.Node, n)
	for i := range out {
		a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		out[i] = nodewatch.Node{Name: fmt.Sprintf("edge-%05d", i), Edge: true, InternalIPs: []netip.Addr{a}}
	}
	return out
}

func gen(n int, zone, hostsFile, queryFile string) error {
	ns := nodes(n)
	if err := writeLines(hostsFile, ns, func(nd nodewatch.Node) string {
		return fmt.Sprintf("%s %s.%s", nd.InternalIPs[0], nd.Name, zone)
	}); err != nil {
		return err
	}
	return writeLines(queryFile, ns, func(nd nodewatch.Node) string {
		return fmt.Sprintf("%s.%s A", nd.Name, zone)
	})
}

func writeLines(path string, ns []nodewatch.Node, line func(nodewatch.Node) string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for _, nd := range ns {
		fmt.Fprintln(w, line(nd))
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}

func serve(n int, zone, listen string) error {
	snap := &nodewatch.Snapshot{Nodes: make(map[string]nodewatch.Node, n), Version: 1}
	for _, nd := range nodes(n) {
		snap.Nodes[nd.Name] = nd
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	opts := dns.Options{Zones: []string{zone}, Logger: log}
	if err := opts.Validate(); err != nil {
		return err
	}
	s, err := dns.New(opts)
	if err != nil {
		return err
	}
	s.Update(snap)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return s.ListenAndServe(ctx, listen)
}
