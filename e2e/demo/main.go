// Command demo is `make demo`: it builds a small world on this machine — a
// real kube-apiserver, tether-gateway in a cloud network, two edge sites
// behind NAT with tether-edge and a stand-in kubelet on each edge node —
// and shows a cloud client reaching each edge's kubelet through the tunnel
// with curl, verifying the kubelet's own certificate. Ctrl-C stops it and
// removes everything it created.
//
// With --tour (`make demo-tour`) it goes on to the rest of the product, in
// a world of three edges (edge-1 and edge-2 in pool site-a, edge-3 in
// site-b) whose tether-edges are their nodes' apiserver proxies: service
// topology under a real kube-proxy, a node cut from the cloud kept Ready
// by its pool while kubemark's hollow kubelet (the kubelet's own code)
// runs behind its tether-edge, and `kubectl logs` through kube-apiserver
// (tour.go).
//
// It needs root (network namespaces) and uses only addresses inside the
// namespaces it creates.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

func main() {
	binDir := flag.String("bin-dir", "bin", "directory holding tether-gateway and tether-edge (built by `make build`); empty builds them into a temporary directory")
	once := flag.Bool("once", false, "run straight through and exit (status 1 if a step did not show what it claims) instead of pausing between tour steps and waiting for Ctrl-C at the end")
	tour := flag.Bool("tour", false, "after the tunnel, tour the rest of the product: service topology under a real kube-proxy, a node cut from the cloud kept Ready by its pool, kubectl logs through kube-apiserver (about two minutes more)")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "Usage: demo [--bin-dir DIR] [--once] [--tour]\n\nRuns the Tether demo in network namespaces on this machine (needs root).\n\n")
		flag.PrintDefaults()
	}
	flag.Parse()

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "demo: needs root (it creates network namespaces); run `sudo make demo`")
		os.Exit(2)
	}
	// SIGHUP too: closing the terminal cleans up as Ctrl-C does.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()

	s := &testenv.Session{Log: log}
	err := s.Run(func() error { return run(ctx, s, *binDir, *once, *tour) })
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("demo: cleaned up")
}

func step(format string, args ...any) {
	fmt.Printf("==> "+format+"\n", args...)
}

func run(ctx context.Context, s *testenv.Session, binDir string, once, tour bool) error {
	bins, err := binaries(s, binDir)
	if err != nil {
		return err
	}
	step("building the world (the first run builds kube-apiserver and etcd from their Go modules: several minutes)")
	testenv.Binaries(s)
	var t *tourWorld
	opts := world.Options{}
	if tour {
		if t, opts, err = newTour(s, once); err != nil {
			return err
		}
	}
	w := world.New(s, bins, opts, step)
	if t != nil {
		if err := t.prepare(ctx, s, w); err != nil {
			return err
		}
	}

	gw := w.Gateways[0]
	step("starting tether-gateway on %s (QUIC :%d/udp, transparent listener :%d, nftables DNAT, DNS :53 for *.%s)", gw.Addr, world.TunnelPort, world.ProxyPort, world.Zone)
	w.StartGateway(s, gw, "--netrules", "nftables", "--dns-listen", ":53", "--dns-zone", world.Zone)
	for _, e := range w.Edges {
		step("starting tether-edge on %s: dials out to the gateway, allows :%d", e.Name, world.KubeletPort)
		var extra []string
		if t != nil {
			// The tour's hollow kubelets say "hollow-kubelet" in their
			// User-Agent: tether-edge caches their reads as the kubelet's.
			extra = append(w.ProxyArgs(e), "--cache-components", world.HollowComponents)
		}
		w.StartEdge(s, e, extra...)
	}
	step("the VPC routes the edge sites' ranges to the gateway (node-ip mode): route on the client host")
	w.RouteSitesVia(s, gw)
	step("the client host resolves names through the gateway's DNS (search %s)", world.Zone)
	world.ResolveVia(s, w.Client, gw, world.Zone)

	step("waiting for the edges to reach the gateway")
	if err := w.WaitReachable(ctx, 30*time.Second); err != nil {
		return err
	}
	for _, e := range w.Edges {
		url := fmt.Sprintf("https://%s:%d/healthz", e.Name, world.KubeletPort)
		step("cloud client: curl --cacert kubelet-ca.crt %s   (edge %s is behind NAT at %s)", url, e.Name, e.Site.Name)
		out, err := w.Curl(ctx, url)
		if err != nil {
			return fmt.Errorf("curl %s: %v: %s", url, err, out)
		}
		fmt.Printf("    %s", out)
		fmt.Printf("    TLS verified against the kubelet's own CA: the gateway never terminated it\n")
	}
	step("gateway status: curl http://%s:%d/status", gw.Addr, world.AdminPort)
	if out, err := gw.Command(ctx, "curl", "--silent", fmt.Sprintf("http://%s:%d/status", gw.Addr, world.AdminPort)).CombinedOutput(); err == nil {
		fmt.Printf("%s\n", out)
	}
	if t != nil {
		if err := t.run(ctx, s, w); err != nil {
			return err
		}
	}
	if once {
		return nil
	}
	step("running; press Ctrl-C to stop and clean up")
	<-ctx.Done()
	return nil
}

func binaries(s *testenv.Session, dir string) (world.Binaries, error) {
	if dir != "" {
		b := world.Binaries{Gateway: filepath.Join(dir, "tether-gateway"), Edge: filepath.Join(dir, "tether-edge"), Ctl: filepath.Join(dir, "tetherctl")}
		if _, err := os.Stat(b.Gateway); err == nil {
			return b, nil
		}
	}
	tmp, err := os.MkdirTemp("", "tether-demo-bin-")
	if err != nil {
		return world.Binaries{}, err
	}
	s.Cleanup(func() { os.RemoveAll(tmp) })
	step("building tether-gateway and tether-edge")
	return world.BuildBinaries(tmp)
}
