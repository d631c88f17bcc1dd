package packaging_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/tether-edge/tether/edgeproxy"
	"github.com/tether-edge/tether/edgeproxy/apiproxy"
	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/edgeproxy/edgeservice"
	"github.com/tether-edge/tether/edgeproxy/edgetunnel"
	"github.com/tether-edge/tether/edgeproxy/identity"
	"github.com/tether-edge/tether/edgeproxy/upstream"
	"github.com/tether-edge/tether/gateway"
	"github.com/tether-edge/tether/internal/openyurt"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/netrules"
)

// This file learns what the two programs export, from their own metric
// registrations, for TestMetricNames.
//
// tether-gateway: gateway.New, as the program calls it, with every part that
// has metrics turned on (DNAT with nftables, DNS, the update trigger, the
// hosts ConfigMap, the delegated-heartbeat taint), inside a network
// namespace of the test's (nftables is probed there, never on the host);
// then the descriptors of its registry (Gateway.Metrics), which list every
// metric and label even before any series exists, and its series for the
// types.
//
// tether-edge: edgeproxy.Run, as the program calls it, with the tunnel, the
// apiserver proxy, the node pool and a client certificate from the CSR API
// (--bootstrap-kubeconfig, one valid already in --data-dir), against a real
// kube-apiserver; then its /metrics. A scrape shows a labelled metric only
// once a series of it exists, and two parts make theirs on traffic: the
// apiserver proxy (requests, cache hits, replays... of node components)
// and the tunnel's RTT (while connected), and the cache's evictions and
// compactions. Their descriptors are read from apiproxy.New,
// edgetunnel.New and the cache's Register, as Run calls them, with a
// registry of the test's.

// exportedByPrograms starts both programs' metric registrations and reads
// what they export.
func exportedByPrograms(t *testing.T) (gw, edge exported) {
	t.Helper()
	testenv.RequireRoot(t) // the gateway's nftables probe runs in a namespace of its own
	cp := testenv.StartControlPlane(t, testenv.ControlPlaneOptions{})
	gw = gatewayMetrics(t, cp)
	edge = edgeMetrics(t, cp)
	return gw, edge
}

func gatewayMetrics(t *testing.T, cp *testenv.ControlPlane) exported {
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
	cfg := gateway.DefaultConfig()
	cfg.Kubeconfig = cp.AdminKubeconfig
	cfg.ClientCA, cfg.TLSCert, cfg.TLSKey = caFile, certFile, keyFile
	cfg.TunnelListen, cfg.ProxyPort, cfg.AdminListen, cfg.DNSListen = "127.0.0.1:0", 0, "127.0.0.1:0", "127.0.0.1:0"
	cfg.NetRules = netrules.KindNFTables
	cfg.EnableUpdateTrigger = true
	cfg.DelegatedHeartbeatTaint = true
	cfg.EdgeServices = true
	cfg.HostsConfigMap = "kube-system/tether-hosts"
	cfg.Replica = "metrics"
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))

	// New binds the listeners in the namespace and probes nftables there;
	// the gateway is not run (its DNAT would program whichever namespace
	// the reconciler's thread is in), so nothing else touches the host.
	// The listeners stay open until the test process ends.
	h := testenv.NewHost(t, "metrics-gw")
	var g *gateway.Gateway
	if err := h.Do(func() (err error) {
		g, err = gateway.New(cfg)
		return err
	}); err != nil {
		t.Fatalf("gateway.New: %v", err)
	}
	return fromRegistry(t, g.Metrics())
}

func edgeMetrics(t *testing.T, cp *testenv.ControlPlane) exported {
	t.Helper()
	const node, pool = "metrics-edge", "metrics-pool"
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// What every node reads through tether-edge (the pool lists the Nodes),
	// and the pools' election records.
	if err := testenv.ApplyManifests(ctx, cp.Admin, false, "kubernetes/edge-rbac.yaml", "kubernetes/pool-rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{
		Name:   node,
		Labels: map[string]string{openyurt.PoolLabel: pool, "openyurt.io/is-edge-worker": "true"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The node's client certificate, as the CSR API would have issued it,
	// where tether-edge keeps it: no request is made.
	dataDir := t.TempDir()
	kp, err := cp.CA.NodeCert(node)
	if err != nil {
		t.Fatal(err)
	}
	certPath := identity.CertPath(dataDir)
	if err := os.MkdirAll(filepath.Dir(certPath), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certPath, append(append([]byte{}, kp.CertPEM...), kp.KeyPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	gwCA := testenv.MustCA(t, "gateways")
	gwCAFile, err := gwCA.WriteFile(dataDir, "gateway-ca")
	if err != nil {
		t.Fatal(err)
	}

	cfg := edgeproxy.DefaultConfig()
	cfg.NodeName = node
	cfg.BootstrapKubeconfig = cp.Kubeconfig(t, "system:node:"+node, kp)
	cfg.DataDir = dataDir
	// A gateway that never answers: the tunnel's per-gateway series exist
	// all the same (connected 0).
	cfg.Gateway = []string{freeAddr(t, "udp")}
	cfg.GatewayCA = gwCAFile
	cfg.GatewayServerName = "gateway"
	cfg.APIServerListen = freeAddr(t, "tcp")
	cfg.AdminListen = freeAddr(t, "tcp")
	cfg.PoolListen = freeAddr(t, "tcp")
	cfg.Pool = pool
	cfg.HealthCheckInterval = metav1.Duration{Duration: 200 * time.Millisecond}
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))

	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- edgeproxy.Run(runCtx, cfg) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("edgeproxy.Run: %v", err)
		}
	}()

	// Every part has registered once the pool runs (after the Node list)
	// and a health probe has been counted.
	var text string
	testenv.EventuallyWithin(t, 90*time.Second, "tether-edge's /metrics to show its node pool and apiserver probes", func() bool {
		if len(done) > 0 {
			t.Fatal("edgeproxy.Run ended early")
		}
		text, err = scrape(ctx, "http://"+cfg.AdminListen+"/metrics")
		return err == nil && strings.Contains(text, "tether_edge_pool_leader ") && strings.Contains(text, "tether_edge_apiserver_upstream_probes_total{")
	})
	e, err := parseExposition(text)
	if err != nil {
		t.Fatal(err)
	}

	// The parts whose labelled metrics appear only with traffic.
	reg := prometheus.NewRegistry()
	ups, err := upstream.New(upstream.Options{Servers: []string{cp.URL}})
	if err != nil {
		t.Fatal(err)
	}
	store, err := cache.Open(filepath.Join(t.TempDir(), cache.FileName), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if _, err := apiproxy.New(apiproxy.Options{Upstream: ups, Store: store, Registerer: reg}); err != nil {
		t.Fatalf("apiproxy.New: %v", err)
	}
	if err := store.Register(reg); err != nil { // as Run registers the cache's
		t.Fatalf("cache metrics: %v", err)
	}
	if _, err := edgetunnel.New(edgetunnel.Options{Gateways: cfg.Gateway, AllowPorts: cfg.AllowPorts, Registry: reg,
		Certificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &kp.TLS, nil }}); err != nil {
		t.Fatalf("edgetunnel.New: %v", err)
	}
	// --edge-services would program the host's nftables: its metrics
	// come from the listener alone.
	if _, err := edgeservice.New(edgeservice.Options{Index: &edgeservice.Index{}, Dialer: edgeservice.Tunnel{}, Registry: reg}); err != nil {
		t.Fatalf("edgeservice.New: %v", err)
	}
	for name, f := range fromRegistry(t, reg) {
		if have, ok := e[name]; ok {
			f.labels = append(f.labels, have.labels...)
			if f.typ == "" {
				f.typ = have.typ
			}
			if f.help == "" {
				f.help = have.help
			}
		}
		e[name] = f
	}
	return e
}

// fromRegistry reads every descriptor of reg (label names included) and
// the types of the metrics that have series.
func fromRegistry(t *testing.T, reg *prometheus.Registry) exported {
	t.Helper()
	e := exported{}
	ch := make(chan *prometheus.Desc)
	go func() {
		reg.Describe(ch)
		close(ch)
	}()
	for d := range ch {
		name, help, labels, err := parseDesc(d.String())
		if err != nil {
			t.Fatal(err)
		}
		f := e[name]
		f.labels = append(f.labels, labels...)
		f.help = help
		e[name] = f
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range fams {
		f := e[mf.GetName()]
		f.typ = strings.ToLower(mf.GetType().String())
		e[mf.GetName()] = f
	}
	return e
}

// descRE reads prometheus.Desc.String():
// Desc{fqName: "n", help: "...", unit: "", constLabels: {a="b"}, variableLabels: {c,d}}.
var descRE = regexp.MustCompile(`^Desc\{fqName: ("(?:[^"\\]|\\.)*"), help: ("(?:[^"\\]|\\.)*"), .*constLabels: \{(.*)\}, variableLabels: \{(.*)\}\}$`)

func parseDesc(s string) (name, help string, labels []string, err error) {
	m := descRE.FindStringSubmatch(s)
	if m == nil {
		return "", "", nil, fmt.Errorf("cannot read the descriptor %s", s)
	}
	if name, err = strconv.Unquote(m[1]); err != nil {
		return "", "", nil, fmt.Errorf("descriptor %s: %w", s, err)
	}
	if help, err = strconv.Unquote(m[2]); err != nil {
		return "", "", nil, fmt.Errorf("descriptor %s: %w", s, err)
	}
	for _, kv := range regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)="`).FindAllStringSubmatch(m[3], -1) {
		labels = append(labels, kv[1])
	}
	for _, l := range strings.Split(m[4], ",") {
		// A constrained label is shown as c(name).
		if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
			labels = append(labels, l)
		}
	}
	return name, help, labels, nil
}

// parseExposition reads the families of a text exposition: their types
// (# TYPE) and the label names of their samples.
func parseExposition(text string) (exported, error) {
	e := exported{}
	helps := map[string]string{} // # HELP comes before # TYPE
	var current string           // the family of the last # TYPE line
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if f, ok := strings.CutPrefix(line, "# HELP "); ok {
			name, help, _ := strings.Cut(f, " ")
			helps[name] = strings.NewReplacer(`\\`, `\`, `\n`, "\n").Replace(help)
			continue
		}
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(f, " ")
			current = name
			e[name] = family{typ: typ, help: helps[name]}
			continue
		}
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, _ := strings.Cut(line, "{")
		name, _, _ = strings.Cut(name, " ")
		if name != current && !strings.HasPrefix(name, current+"_") {
			return nil, fmt.Errorf("sample %q outside its family (%s)", line, current)
		}
		f := e[current]
		if rest != "" {
			for _, kv := range regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)="(?:[^"\\]|\\.)*"`).FindAllStringSubmatch(rest, -1) {
				if l := kv[1]; !slices.Contains(f.labels, l) && !(l == "le" && f.typ == "histogram") && !(l == "quantile" && f.typ == "summary") {
					f.labels = append(f.labels, l)
				}
			}
		}
		e[current] = f
	}
	return e, sc.Err()
}

func scrape(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), err
}

// freeAddr is a loopback address with a port the kernel just gave out.
func freeAddr(t *testing.T, network string) string {
	t.Helper()
	if network == "udp" {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		return pc.LocalAddr().String()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
