package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// podman runs podman as ENVIRONMENT.md says it works here: daemonless, as
// root, with the repository's containers.conf, runc and cgroupfs.
func podman(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "podman", append([]string{"--cgroup-manager", "cgroupfs"}, args...)...)
	cmd.Env = append(os.Environ(), "CONTAINERS_CONF="+filepath.Join(world.RepoRoot(), "packaging", "docker", "containers.conf"))
	return cmd
}

// TestContainerImage builds the tether-gateway image from the Dockerfile
// (from this test's binary, built with CGO disabled) and runs the gateway
// from it in the cloud namespace of the e2e world, on that namespace's
// host network with NET_ADMIN as docs/install.md's `docker run` line does: a
// cloud client reaches each edge's kubelet through the containerised
// gateway, and stopping the container removes the gateway's DNAT rules.
func TestContainerImage(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("podman"); err != nil {
		t.Fatal("podman is not installed (make deps installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// podman must leave the host's network namespace alone (no netavark
	// bridge, rules or ip_forward): the build runs with --network none and
	// the container in the world's namespace.
	hostBefore := hostNetState(t)
	t.Cleanup(func() {
		if after := hostNetState(t); after != hostBefore {
			t.Errorf("podman changed the host's network namespace:\nbefore:\n%s\nafter:\n%s", hostBefore, after)
		}
	})

	image := fmt.Sprintf("localhost/tether-gateway:e2e-%d", os.Getpid())
	build := exec.CommandContext(ctx, filepath.Join(world.RepoRoot(), "packaging", "docker", "build-image.sh"),
		filepath.Dir(bins.Gateway), "tether-gateway", image)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build image: %v\n%s", err, out)
	}
	t.Cleanup(func() { podman(context.Background(), "rmi", "--force", image).Run() })

	// Nothing but the binary and the CA bundle.
	out, err := podman(ctx, "image", "inspect", "--format", "{{len .RootFS.Layers}} {{.Config.Entrypoint}} {{.Config.User}}", image).CombinedOutput()
	if err != nil {
		t.Fatalf("inspect: %v\n%s", err, out)
	}
	if got, want := strings.TrimSpace(string(out)), "2 [/usr/bin/tether-gateway]"; got != want {
		t.Errorf("image layers, entrypoint, user = %q, want %q (FROM scratch, CA bundle, binary)", got, want)
	}

	w := world.New(t, bins, world.Options{}, t.Logf)
	gw := w.Gateways[0]
	name := fmt.Sprintf("tether-e2e-%d", os.Getpid())
	// The gateway's files (certificates, CAs, kubeconfig) are mounted at
	// the same paths, read-only, as an operator mounts /etc/tether.
	args := []string{"run", "--detach", "--name", name, "--runtime", "runc", "--log-driver", "k8s-file",
		"--network", "ns:/var/run/netns/" + gw.Name, "--cap-add", "NET_ADMIN",
		"--volume", w.Dir + ":" + w.Dir + ":ro", "--volume", w.CP.Dir + ":" + w.CP.Dir + ":ro",
		image}
	args = append(args, w.GatewayArgs(gw, t)...)
	args = append(args, "--netrules", "nftables")
	if out, err := podman(ctx, args...).CombinedOutput(); err != nil {
		t.Fatalf("podman run: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := podman(context.Background(), "logs", name).CombinedOutput()
			t.Logf("gateway container log:\n%s", out)
		}
		podman(context.Background(), "rm", "--force", "--time", "0", name).Run()
	})

	for _, e := range w.Edges {
		w.StartEdge(t, e)
	}
	// A client that names the node in TLS SNI, dialling the gateway.
	for _, e := range w.Edges {
		if out, err := curlViaGateway(ctx, w, gw, e, "/healthz", 30*time.Second); err != nil || strings.TrimSpace(out) != "ok "+e.Name {
			t.Fatalf("%s by SNI through the containerised gateway: %v: %q", e.Name, err, out)
		}
	}
	// A client that dials the node's own address, routed to the gateway:
	// the DNAT rules the gateway programmed from inside its container.
	w.RouteSitesVia(t, gw)
	if err := w.WaitReachable(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if rules := gw.Run(t, "nft", "list", "tables"); !strings.Contains(rules, "inet tether") {
		t.Errorf("no Tether table in the gateway's namespace while it runs:\n%s", rules)
	}

	// SIGTERM through podman: the gateway drains and removes its rules.
	if out, err := podman(ctx, "stop", "--time", "30", name).CombinedOutput(); err != nil {
		t.Fatalf("podman stop: %v\n%s", err, out)
	}
	out, err = podman(ctx, "inspect", "--format", "{{.State.ExitCode}}", name).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "0" {
		t.Errorf("gateway container exit code %q (%v), want 0 after SIGTERM", out, err)
	}
	if rules := gw.Run(t, "nft", "list", "tables"); strings.Contains(rules, "inet tether") {
		t.Errorf("the Tether table outlived the container:\n%s", rules)
	}
}

// curlViaGateway asks e's kubelet for path through gw's transparent
// listener, naming the node in TLS SNI (no DNAT involved), retrying until
// the edge is connected or the timeout ends. The client trusts only the
// kubelets' CA: an answer proves TLS went end to end.
func curlViaGateway(ctx context.Context, w *world.World, gw *testenv.Host, e *world.Edge, path string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		out, err := w.Client.Command(ctx, "curl", "--silent", "--show-error", "--fail", "--max-time", "5",
			"--cacert", w.Path("kubelet-ca.crt"),
			"--connect-to", fmt.Sprintf("%s:%d:%s:%d", e.Name, world.KubeletPort, gw.Addr, world.ProxyPort),
			fmt.Sprintf("https://%s:%d%s", e.Name, world.KubeletPort, path)).CombinedOutput()
		if err == nil {
			return string(out), nil
		}
		select {
		case <-ctx.Done():
			return string(out), fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// hostNetState is the host namespace's ruleset and forwarding switch.
func hostNetState(t *testing.T) string {
	t.Helper()
	rules, err := exec.Command("nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list ruleset: %v\n%s", err, rules)
	}
	fwd, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("ip_forward=%s%s", fwd, rules)
}
