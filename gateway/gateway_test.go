package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"

	"github.com/tether-edge/tether/gateway/internal/edgetest"
	"github.com/tether-edge/tether/gateway/nodewatch"
	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

func TestValidate(t *testing.T) {
	valid := DefaultConfig()
	valid.ClientCA, valid.TLSCert, valid.TLSKey = "/ca.pem", "/gw.pem", "/gw.key"
	if err := valid.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"no client CA", func(c *Config) { c.ClientCA = "" }, "--client-ca is required"},
		{"cert without key", func(c *Config) { c.TLSKey = "" }, "--tls-key is required with --tls-cert"},
		{"key without cert", func(c *Config) { c.TLSCert = "" }, "--tls-cert is required with --tls-key"},
		{"self-managed without a data dir", func(c *Config) { c.TLSCert, c.TLSKey, c.DataDir = "", "", "" }, "--data-dir is required"},
		{"bad server name", func(c *Config) { c.ServerNames = []string{"gw_1"} }, `--server-name "gw_1"`},
		{"bad listen", func(c *Config) { c.TunnelListen = "10262" }, `--tunnel-listen "10262"`},
		{"bad port", func(c *Config) { c.ProxyPort = 70000 }, "--proxy-port 70000"},
		{"bad mode", func(c *Config) { c.Mode = "nat" }, `unknown address mode "nat"`},
		{"vip without cidr", func(c *Config) { c.Mode = "vip" }, "--vip-cidr is required with --mode=vip"},
		{"bad cidr", func(c *Config) { c.VIPCIDR = "100.64.0.0" }, `--vip-cidr "100.64.0.0"`},
		{"bad netrules", func(c *Config) { c.NetRules = "ipfw" }, `--netrules "ipfw"`},
		{"bad selector", func(c *Config) { c.EdgeSelector = "a b c" }, "--edge-selector"},
		{"empty selector", func(c *Config) { c.EdgeSelector = "" }, "every node an edge node"},
		{"bad zone", func(c *Config) { c.DNSZones = []string{"under_score.example"} }, `--dns-zone "under_score.example"`},
		{"no streams", func(c *Config) { c.MaxStreamsPerEdge = 0 }, "--max-streams-per-edge 0"},
		{"no taint renewals", func(c *Config) { c.DelegatedHeartbeatTaintRenewals = 0 }, "--delegated-heartbeat-taint-renewals 0"},
		{"no idle", func(c *Config) { c.IdleTimeout = metav1.Duration{} }, "--idle-timeout 0s"},
		{"no kube QPS", func(c *Config) { c.KubeAPIQPS = 0 }, "--kube-api-qps 0"},
		{"bad pod cidr", func(c *Config) { c.EdgePodCIDRs = []string{"10.244.0.0"} }, `--edge-pod-cidrs "10.244.0.0"`},
		{"one widest length", func(c *Config) { c.WidestPodCIDR = "16" }, "want two prefix lengths"},
		{"bad widest length", func(c *Config) { c.WidestPodCIDR = "16,129" }, `--widest-pod-cidr "129"`},
		{"no kube burst", func(c *Config) { c.KubeAPIBurst = 0 }, "--kube-api-burst 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := valid
			tc.change(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
	// Every problem is reported at once.
	c := DefaultConfig()
	c.Mode, c.TLSKey, c.ServerNames = "nat", "/gw.key", []string{"-"}
	err := c.Validate()
	for _, want := range []string{"--client-ca", "--tls-cert", "--server-name", "--mode"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate() = %v, want it to mention %s", err, want)
		}
	}
}

// TestRun runs the whole gateway against a real kube-apiserver: the Node
// objects it reads decide where a proxied connection goes, /readyz waits
// for them, /status shows the edge with its pool, and shutdown closes the
// tunnels with CloseShutdown.
func TestRun(t *testing.T) {
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	ctx := context.Background()
	for _, n := range []struct{ name, addr, pool string }{
		{"edge-1", "10.20.0.1", "pool-a"},
		{"edge-2", "10.20.0.2", "pool-b"},
	} {
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{
				nodewatch.EdgeLabel: "true", nodewatch.PoolLabel: n.pool,
			}},
			Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.addr}}},
		}
		if _, err := cp.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	cfg, ca := testConfig(t, cp.AdminKubeconfig)
	cfg.DNSListen = "127.0.0.1:0"
	cfg.DNSZones = []string{"tether.internal"}
	cfg.Replica = "gw-test"
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- g.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	admin := "http://" + g.AdminAddr().String()
	testenv.Eventually(t, "/readyz answers ok", func() bool { return httpGet(t, admin+"/readyz") == "ok\n" })

	kp, err := ca.NodeCert("edge-1")
	if err != nil {
		t.Fatal(err)
	}
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	edge, err := edgetest.Dial(dctx, g.TunnelAddr().String(), edgetest.Options{
		Cert: kp.TLS, Roots: ca.Pool(), ServerName: "gateway",
		Allow: func(tunnel.Request) tunnel.Code { return tunnel.NotAllowed },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(edge.Close)

	var st statusapi.Gateway
	testenv.Eventually(t, "/status lists edge-1", func() bool {
		st = statusapi.Gateway{}
		json.Unmarshal([]byte(httpGet(t, admin+"/status")), &st)
		return len(st.Edges) == 1
	})
	if e := st.Edges[0]; st.Replica != "gw-test" || !st.Ready || st.EdgeNodes != 2 ||
		e.Node != "edge-1" || e.Pool != "pool-a" || e.Remote == "" || e.ConnectedSince.IsZero() {
		t.Fatalf("status %+v", st)
	}

	// The DNS server answers the node's name from the same watcher.
	q := new(dns.Msg)
	q.SetQuestion("edge-1.tether.internal.", dns.TypeA)
	in, err := dns.Exchange(q, g.DNSAddr().String())
	if err != nil {
		t.Fatalf("dns query: %v", err)
	}
	if len(in.Answer) != 1 || in.Answer[0].(*dns.A).A.String() != "10.20.0.1" {
		t.Fatalf("edge-1.tether.internal. A = %v, want 10.20.0.1", in.Answer)
	}

	// A client that dials the proxy port directly, naming edge-1 in its
	// ClientHello, is sent to edge-1's address from its Node object, port
	// 10250. The test edge refuses; the client sees a reset.
	c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", portOf(g.ProxyAddr())))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// Only the ClientHello is sent, and only the test reads c: a reset is
	// reported once, to whichever read gets it (a TLS client reading too
	// would leave EOF for this one).
	if _, err := c.Write(testenv.ClientHello(t, "edge-1.tether.internal")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(c).ReadByte(); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("client read: %v, want a reset", err)
	}
	reqs := edge.Requests()
	if len(reqs) != 1 || reqs[0].Dest != netip.MustParseAddrPort("10.20.0.1:10250") {
		t.Fatalf("edge requests %+v, want one for 10.20.0.1:10250", reqs)
	}
	metrics := httpGet(t, admin+"/metrics")
	for _, want := range []string{
		`tether_gateway_proxy_refusals_total{reason="not_allowed"} 1`,
		`tether_gateway_edge_refusals_total{node="edge-1",reason="not_allowed"} 1`,
		`tether_gateway_edges_connected 1`,
		`tether_gateway_edges_without_tunnel 1`, // edge-2
		`tether_gateway_tunnel_connections_total{result="registered"} 1`,
		`tether_gateway_edge_rtt_seconds{node="edge-1"}`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	done <- nil
	if code, ok := edge.WaitClosed(5 * time.Second); !ok || code != tunnel.CloseShutdown {
		t.Fatalf("edge closed with %v (by gateway: %v), want CloseShutdown", code, ok)
	}
}

// testConfig is a gateway configuration for tests with kubeconfig: ca
// signs the serving certificate (for the name "gateway") and verifies the
// edges' certificates; the listeners are on loopback ports of the
// kernel's choice; no DNS, no netrules (the host's netfilter is not the
// test's; e2e programs rules in namespaces); logs go to the test's.
func testConfig(t *testing.T, kubeconfig string) (Config, *testenv.CA) {
	t.Helper()
	dir := t.TempDir()
	ca := testenv.MustCA(t, "tether edges")
	caFile, err := ca.WriteFile(dir, "client-ca")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.ServerCert("gateway", "gateway")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, err := srv.WriteFiles(dir, "gateway")
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Kubeconfig = kubeconfig
	cfg.ClientCA, cfg.TLSCert, cfg.TLSKey = caFile, certFile, keyFile
	cfg.TunnelListen, cfg.ProxyPort, cfg.AdminListen = "127.0.0.1:0", 0, "127.0.0.1:0"
	cfg.DNSListen, cfg.NetRules = "", "none"
	cfg.ShutdownGrace = metav1.Duration{Duration: time.Second}
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	return cfg, ca
}

func TestNewFailsCleanly(t *testing.T) {
	dir := t.TempDir()
	ca := testenv.MustCA(t, "tether edges")
	caFile, _ := ca.WriteFile(dir, "client-ca")
	cfg := DefaultConfig()
	cfg.ClientCA, cfg.TLSCert, cfg.TLSKey = caFile, dir+"/missing.crt", dir+"/missing.key"
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "--tls-cert") {
		t.Fatalf("New with a missing certificate: %v", err)
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func portOf(a net.Addr) string {
	_, port, _ := net.SplitHostPort(a.String())
	return port
}

// --kube-api-qps and --kube-api-burst reach the client's rate limiter:
// the default QPS, and a burst of exactly that many requests at a rate too
// low to refill during the test.
func TestKubeClientRateLimit(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600)
	limiter := func(cfg Config) flowcontrol.RateLimiter {
		t.Helper()
		client, err := kubeClient(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return client.(*kubernetes.Clientset).CoreV1().RESTClient().(*rest.RESTClient).GetRateLimiter()
	}
	cfg := DefaultConfig()
	cfg.Kubeconfig = kubeconfig
	if qps := limiter(cfg).QPS(); qps != DefaultKubeAPIQPS {
		t.Errorf("default QPS %v, want %v", qps, DefaultKubeAPIQPS)
	}
	cfg.KubeAPIQPS, cfg.KubeAPIBurst = 0.001, 7
	rl := limiter(cfg)
	if qps := rl.QPS(); qps != float32(0.001) {
		t.Errorf("QPS %v, want 0.001", qps)
	}
	burst := 0
	for rl.TryAccept() {
		burst++
	}
	if burst != 7 {
		t.Errorf("%d requests let through at once, want the burst of 7", burst)
	}
}
