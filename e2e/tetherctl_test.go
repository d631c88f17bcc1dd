package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/testenv"
)

// ctlStatus is one element of `tetherctl status -o json`.
type ctlStatus struct {
	URL string `json:"gateway"`
	statusapi.Gateway
}

// TestTetherctl runs tetherctl on the cloud client host against two real
// gateway replicas that both edges are connected to.
func TestTetherctl(t *testing.T) {
	testenv.RequireRoot(t)
	ctl := bins.Ctl
	w := world.New(t, bins, world.Options{Gateways: 2}, t.Logf)
	for _, gw := range w.Gateways {
		w.StartGateway(t, gw, "--netrules", "nftables", "--replica", gw.Label)
	}
	for _, e := range w.Edges {
		w.StartEdge(t, e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// 1 MiB from edge-1's kubelet through gw1.
	const n = 1 << 20
	if out, err := curlViaGateway(ctx, w, w.Gateways[0], w.Edges[0], fmt.Sprintf("/bytes?n=%d", n), 30*time.Second); err != nil || len(out) != n {
		t.Fatalf("transfer of %d bytes: got %d: %v", n, len(out), err)
	}

	var urls []string
	for _, gw := range w.Gateways {
		urls = append(urls, fmt.Sprintf("http://%s:%d", gw.Addr, world.AdminPort))
	}
	gateways := strings.Join(urls, ",")
	ctlRun := func(args ...string) (stdout, stderr string, err error) {
		cmd := w.Client.Command(ctx, ctl, args...)
		var o, e strings.Builder
		cmd.Stdout, cmd.Stderr = &o, &e
		err = cmd.Run()
		return o.String(), e.String(), err
	}

	// The edges dial both replicas; wait until both list both edges and
	// are ready (a replica's election record informer may sync after its
	// edges have connected).
	var got []ctlStatus
	for {
		out, errOut, err := ctlRun("status", "-o", "json", "--gateway", gateways)
		if err != nil {
			t.Fatalf("tetherctl status -o json: %v\n%s", err, errOut)
		}
		got = nil
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("tetherctl -o json printed no JSON list: %v\n%s", err, out)
		}
		if len(got) == 2 && len(got[0].Edges) == 2 && len(got[1].Edges) == 2 && got[0].Ready && got[1].Ready {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("both replicas never listed both edges and were ready:\n%s", out)
		case <-time.After(200 * time.Millisecond):
		}
	}

	t.Run("json", func(t *testing.T) {
		for i, st := range got {
			gw := w.Gateways[i]
			if st.URL != urls[i] || st.Replica != gw.Label || !st.Ready || st.EdgeNodes != 2 {
				t.Errorf("gateway %d: url %q replica %q ready %v edge nodes %d; want %q, %q, true, 2",
					i, st.URL, st.Replica, st.Ready, st.EdgeNodes, urls[i], gw.Label)
			}
			for _, e := range st.Edges {
				we := w.Edge(e.Node)
				if we == nil {
					t.Errorf("%s lists unknown edge %q", gw.Label, e.Node)
					continue
				}
				if e.Pool != we.Site.Name {
					t.Errorf("%s: edge %s pool %q, want %q", gw.Label, e.Node, e.Pool, we.Site.Name)
				}
				if e.RTTMillis <= 0 || e.ConnectedSince.IsZero() || time.Since(e.ConnectedSince) > 5*time.Minute {
					t.Errorf("%s: edge %s rtt %vms, connected since %v", gw.Label, e.Node, e.RTTMillis, e.ConnectedSince)
				}
				if i == 0 && e.Node == w.Edges[0].Name && e.BytesDown < n {
					t.Errorf("%s: edge %s bytes down %d, want at least the %d just relayed", gw.Label, e.Node, e.BytesDown, n)
				}
			}
		}
	})

	t.Run("table", func(t *testing.T) {
		out, errOut, err := ctlRun("status", "--gateway", gateways)
		if err != nil {
			t.Fatalf("tetherctl status: %v\n%s", err, errOut)
		}
		t.Logf("tetherctl status --gateway %s:\n%s", gateways, out)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		for i, gw := range w.Gateways {
			if want := fmt.Sprintf("gateway %s: replica %s,", urls[i], gw.Label); !strings.HasPrefix(lines[i], want) ||
				!strings.HasSuffix(lines[i], "ready; 2 of 2 edge nodes connected") {
				t.Errorf("line %d = %q, want %q ... ready; 2 of 2 edge nodes connected", i+1, lines[i], want)
			}
		}
		if len(lines) != 8 || !strings.HasPrefix(lines[3], "NODE") {
			t.Fatalf("want 2 gateway lines, a blank line, a header and 4 rows:\n%s", out)
		}
		var rows []string
		for _, l := range lines[4:] {
			f := strings.Fields(l)
			rows = append(rows, strings.Join(f[:3], " ")) // node, pool, replica
		}
		want := []string{"edge-1 site-a gw1", "edge-1 site-a gw2", "edge-2 site-b gw1", "edge-2 site-b gw2"}
		if !slices.Equal(rows, want) {
			t.Errorf("rows (node pool replica) = %q, want %q:\n%s", rows, want, out)
		}
	})

	t.Run("the metrics reference documents the metrics", func(t *testing.T) {
		table, err := os.ReadFile(filepath.Join(world.RepoRoot(), "docs", "reference", "metrics.md"))
		if err != nil {
			t.Fatal(err)
		}
		documented := map[string]bool{}
		for _, m := range regexp.MustCompile("`(tether_[a-z_]+)`").FindAllStringSubmatch(string(table), -1) {
			documented[m[1]] = true
		}
		for _, scrape := range []struct {
			host *testenv.Host
			url  string
		}{
			{w.Client, urls[0] + "/metrics"},
			{w.Edges[0].Host, "http://127.0.0.1:10267/metrics"},
		} {
			out, err := scrape.host.Command(ctx, "curl", "--silent", "--show-error", "--fail", scrape.url).CombinedOutput()
			if err != nil {
				t.Fatalf("scrape %s: %v\n%s", scrape.url, err, out)
			}
			n := 0
			for _, m := range regexp.MustCompile(`(?m)^# TYPE (tether_[a-z_]+) `).FindAllStringSubmatch(string(out), -1) {
				n++
				if !documented[m[1]] {
					t.Errorf("%s exports %s, which docs/reference/metrics.md lacks", scrape.url, m[1])
				}
			}
			if n == 0 {
				t.Errorf("%s exports no tether_ metric:\n%s", scrape.url, out)
			}
		}
	})

	t.Run("unreachable gateway", func(t *testing.T) {
		if err := w.Stop(w.Gateways[1]); err != nil {
			t.Fatal(err)
		}
		out, errOut, err := ctlRun("status", "--gateway", gateways)
		if exitStatus(err) != 1 {
			t.Errorf("exit status %d, want 1", exitStatus(err))
		}
		if want := "tetherctl: gateway " + urls[1] + " unreachable"; !strings.Contains(errOut, want) || !strings.Contains(errOut, "connection refused") {
			t.Errorf("stderr %q, want %q ... connection refused", errOut, want)
		}
		if !strings.Contains(out, "replica gw1") || strings.Contains(out, "replica gw2") {
			t.Errorf("stdout should still show gw1, and only gw1:\n%s", out)
		}
	})

	// The edges here run without their apiserver proxy, so without a node
	// pool: each site is a pool of one with no leader.
	t.Run("pools", func(t *testing.T) {
		kp, err := w.ClusterCA.ClientCert("tether-gateway")
		if err != nil {
			t.Fatal(err)
		}
		kubeconfig := w.CP.Kubeconfig(t, "tether-gateway", kp) // the gateway's identity and RBAC
		out, errOut, err := ctlRun("pools", "--kubeconfig", kubeconfig)
		if err != nil {
			t.Fatalf("tetherctl pools: %v\n%s", err, errOut)
		}
		t.Logf("tetherctl pools:\n%s", out)
		var rows []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			rows = append(rows, strings.Join(strings.Fields(l), " "))
		}
		want := []string{"POOL MEMBERS LEADER RENEWED LAST SYNC DELEGATED TAINTED", "site-a 1 none - - - -", "site-b 1 none - - - -"}
		if !slices.Equal(rows, want) {
			t.Errorf("tetherctl pools = %q, want %q", rows, want)
		}

		// On an edge node, from its admin endpoint on loopback.
		e := w.Edges[0]
		cmd := e.Host.Command(ctx, ctl, "pools", "--edge", "127.0.0.1")
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("tetherctl pools --edge on %s: %v\n%s", e.Name, err, b)
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "NODE") || !strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), e.Name+" - off -") {
			t.Errorf("tetherctl pools --edge 127.0.0.1 on %s: want its node with no pool:\n%s", e.Name, b)
		}
	})
}
