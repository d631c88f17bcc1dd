package apiproxy

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/tether-edge/tether/edgeproxy/filter"
	"github.com/tether-edge/tether/internal/testenv"
)

// TestTopologyKubeProxy runs the real kube-proxy (nftables mode) on an
// edge host with tether-edge as its apiserver, and reads its ruleset.
func TestTopologyKubeProxy(t *testing.T) {
	testenv.RequireRoot(t)
	if _, err := exec.LookPath("nft"); err != nil {
		if os.Getenv("CI") == "" {
			t.Skip("nft not installed")
		}
		t.Fatalf("nft not installed; CI installs it (make deps): %v", err)
	}
	topo := testenv.NewTopology(t, testenv.TopologySpec{
		CloudHosts: []string{"apiserver"},
		Sites:      []testenv.SiteSpec{{Name: "site", Hosts: []string{"edge"}}},
	})
	cloud := topo.Cloud("apiserver")
	host := topo.Site("site").Host("edge")
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{BindAddress: cloud.Addr.String(), Runner: cloud})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := testenv.ApplyManifests(ctx, cp.Admin, false, "../../packaging/kubernetes/edge-rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	admin := cp.Client
	setupTopology(t, ctx, admin)
	// kube-proxy waits for its Node's addresses.
	if _, err := admin.CoreV1().Nodes().Patch(ctx, "me", types.MergePatchType,
		[]byte(`{"status":{"addresses":[{"type":"InternalIP","address":"192.0.2.10"}]}}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	kp, err := cp.CA.NodeCert("me")
	if err != nil {
		t.Fatal(err)
	}
	e := startEdge(t, edgeSpec{net: host, server: cp.URL, node: "me", cert: kp.TLS, ca: cp.CA, topology: true})
	e.waitHealthy(true, 30*time.Second)

	kubeProxy := testenv.StartKubeProxy(t, host, "me", "http://"+e.Addr)
	endpoints := func() map[string][]string {
		m := map[string][]string{}
		for _, svc := range []string{"host", "pool", "fallback", "plain"} {
			if ips, err := kubeProxy.Endpoints(ctx, "topo", svc); err == nil && ips != nil {
				m[svc] = ips
			}
		}
		return m
	}
	waitRules := func(what string, svc string, want []string) time.Duration {
		t.Helper()
		start := time.Now()
		defer func() {
			if !t.Failed() {
				return
			}
			full, _ := host.Command(ctx, "nft", "list", "ruleset").CombinedOutput()
			var out []byte
			for _, l := range regexp.MustCompile(`(?m)^.*(chain|dnat).*$`).FindAll(full, 40) {
				out = append(append(out, l...), '\n')
			}
			t.Logf("%s: ruleset:\n%s", what, out)
		}()
		testenv.EventuallyNoError(t, what+": kube-proxy's endpoints of "+svc, func() error {
			if got := endpoints(); !slices.Equal(got[svc], want) {
				return fmt.Errorf("endpoints %v, want %s: %v", got, svc, want)
			}
			return nil
		})
		return time.Since(start)
	}
	waitRules("start", "host", []string{"10.1.0.1"})
	waitRules("start", "pool", []string{"10.1.0.1", "10.1.0.2"})
	waitRules("start", "fallback", []string{"10.1.0.2"}) // not ready here: the pool
	waitRules("start", "plain", []string{"10.1.0.1", "10.1.0.2", "10.1.0.3", "10.1.0.4"})
	t.Logf("kube-proxy rules at start: %v", endpoints())

	patchService(t, ctx, admin, "plain", filter.KeyHostname)
	d := waitRules("annotation", "plain", []string{"10.1.0.1"})
	t.Logf("annotation change → kube-proxy's nftables rules changed after %v", d)
	patchNodePool(t, ctx, admin, "b", "p1")
	d = waitRules("pool", "pool", []string{"10.1.0.1", "10.1.0.2", "10.1.0.3"})
	t.Logf("pool change → kube-proxy's nftables rules changed after %v", d)

	// Everything kube-proxy lists and watches through tether-edge with the
	// node's identity is granted by edge-rbac.yaml: once its last informer
	// (ServiceCIDRs) has synced, its log has no "forbidden".
	const synced = `Caches are synced" controller="serviceCIDR config"`
	var kpLog string
	testenv.Eventually(t, "kube-proxy's caches synced", func() bool {
		kpLog = kubeProxy.Log()
		return strings.Contains(kpLog, synced)
	})
	for l := range strings.Lines(kpLog) {
		if strings.Contains(l, "forbidden") {
			t.Errorf("kube-proxy was refused a request (edge-rbac.yaml lacks a grant): %s", l)
		}
	}
}
