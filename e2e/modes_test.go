package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

const zone = world.Zone

// curlByName curls https://<node>:10250/healthz from the client host,
// which resolves names through the gateway's DNS.
func curlByName(ctx context.Context, w *world.World, node string) (string, error) {
	return w.Curl(ctx, fmt.Sprintf("https://%s:%d/healthz", node, world.KubeletPort), "--max-time", "5")
}

// TestNodeNamesByDNS: in node-ip mode a cloud client whose resolver is the
// gateway reaches each edge by its node name (the kubelet's certificate
// names the node, so TLS verifies by name too).
func TestNodeNamesByDNS(t *testing.T) {
	w := newWorld(t, world.Options{}, "--netrules", "nftables", "--dns-listen", ":53", "--dns-zone", zone)
	world.ResolveVia(t, w.Client, w.Gateways[0], zone)
	ctx := context.Background()
	for _, e := range w.Edges {
		for _, name := range []string{e.Name, e.Name + "." + zone} {
			out, err := curlByName(ctx, w, name)
			if err != nil || strings.TrimSpace(out) != "ok "+e.Name {
				t.Errorf("curl by name %s: %v: %s", name, err, out)
			}
		}
		out := w.Client.Run(t, "dig", "+short", "@"+w.Gateways[0].Addr.String(), e.Name+"."+zone, "A")
		if strings.TrimSpace(out) != e.Host.Addr.String() {
			t.Errorf("dig %s = %q, want %s", e.Name, out, e.Host.Addr)
		}
	}

	// A node deleted from the cluster is gone from DNS at once.
	gone := w.Edges[1]
	if err := w.CP.Client.CoreV1().Nodes().Delete(ctx, gone.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.EventuallyWithin(t, 5*time.Second, gone.Name+" to leave DNS", func() bool {
		out, _ := w.Client.Command(ctx, "dig", "@"+w.Gateways[0].Addr.String(), gone.Name+"."+zone, "A").CombinedOutput()
		return strings.Contains(string(out), "status: NXDOMAIN")
	})
}

// TestVIPMode: two sites reuse the same private range, so both edge nodes
// have the InternalIP 192.168.1.10. In vip mode each gets a virtual
// address of its own, recorded on its Node, held on the gateway's tether0
// and answered by DNS; a cloud client reaches each by name.
func TestVIPMode(t *testing.T) {
	testenv.RequireRoot(t)
	lan := netip.MustParsePrefix("192.168.1.0/24")
	vipCIDR := netip.MustParsePrefix("100.127.0.0/24")
	w := world.New(t, bins, world.Options{Sites: []testenv.SiteSpec{
		{Name: "site-a", Hosts: []string{"edge-1"}, LAN: lan},
		{Name: "site-b", Hosts: []string{"edge-2"}, LAN: lan},
	}}, t.Logf)
	gw := w.Gateways[0]
	w.StartGateway(t, gw, "--netrules", "nftables", "--mode", "vip", "--vip-cidr", vipCIDR.String(),
		"--dns-listen", ":53", "--dns-zone", zone)
	for _, e := range w.Edges {
		w.StartEdge(t, e)
	}
	w.RouteVia(t, vipCIDR, gw)
	world.ResolveVia(t, w.Client, gw, zone)
	ctx := context.Background()

	vips := map[string]string{}
	testenv.EventuallyWithin(t, 10*time.Second, "VIPs recorded on the Nodes", func() bool {
		for _, e := range w.Edges {
			n, err := w.CP.Client.CoreV1().Nodes().Get(ctx, e.Name, metav1.GetOptions{})
			if err != nil || n.Annotations["tether.io/vip"] == "" {
				return false
			}
			vips[e.Name] = n.Annotations["tether.io/vip"]
		}
		return true
	})
	if vips["edge-1"] == vips["edge-2"] {
		t.Fatalf("both edges got VIP %s", vips["edge-1"])
	}
	for name, v := range vips {
		if a, err := netip.ParseAddr(v); err != nil || !vipCIDR.Contains(a) {
			t.Errorf("%s has VIP %q, want an address in %s", name, v, vipCIDR)
		}
	}
	held := gw.Run(t, "ip", "-brief", "address", "show", "dev", "tether0")
	for _, e := range w.Edges {
		if !strings.Contains(held, vips[e.Name]+"/32") {
			t.Errorf("tether0 (%s) lacks %s's VIP %s", strings.TrimSpace(held), e.Name, vips[e.Name])
		}
		var out string
		var err error
		testenv.EventuallyWithin(t, 10*time.Second, e.Name+" reachable by name through its VIP", func() bool {
			out, err = curlByName(ctx, w, e.Name)
			return err == nil
		})
		if strings.TrimSpace(out) != "ok "+e.Name {
			t.Errorf("%s answered %q", e.Name, out)
		}
	}

	// The stopped gateway removes what it created: no table, no tether0.
	if err := w.Stop(gw); err != nil {
		t.Fatal(err)
	}
	if out := gw.Run(t, "nft", "list", "tables"); strings.Contains(out, "tether") {
		t.Errorf("table left after the gateway stopped: %s", out)
	}
	if out, err := gw.Command(ctx, "ip", "link", "show", "tether0").CombinedOutput(); err == nil {
		t.Errorf("tether0 left after the gateway stopped: %s", out)
	}
}

// TestDemo runs `make demo`'s program once, as an operator would, and
// checks it showed both edges answering by name.
func TestDemo(t *testing.T) {
	testenv.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "run", "./e2e/demo", "--once", "--bin-dir", filepath.Dir(bins.Gateway))
	cmd.Dir = world.RepoRoot()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	for _, want := range []string{"ok edge-1", "ok edge-2", "TLS verified", "demo: cleaned up"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
}
