package edgeproxy

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/quic-go/quic-go"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/tether-edge/tether/internal/config"
	"github.com/tether-edge/tether/internal/statusapi"
	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/tunnel"
)

func TestValidate(t *testing.T) {
	ok := DefaultConfig()
	ok.Gateway = []string{"gw.example:10262"}
	ok.Cert, ok.Key = "/k.pem", "/k.pem"
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	withServices := ok
	withServices.Kubeconfig, withServices.EdgeServices = "/kc", true
	if err := withServices.Validate(); err != nil {
		t.Fatalf("--edge-services: %v", err)
	}
	proxyOnly := DefaultConfig()
	proxyOnly.Kubeconfig = "/var/lib/kubelet/kubeconfig"
	if err := proxyOnly.Validate(); err != nil {
		t.Fatalf("apiserver proxy alone: %v", err)
	}
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string
	}{
		{"no gateway", func(c *Config) { c.Gateway = nil }, "nothing to do: give --gateway"},
		{"server-addr without cert", func(c *Config) { c.Gateway = nil; c.Cert = ""; c.ServerAddr = []string{"https://10.0.0.1:6443"} }, "--server-addr needs the node's client certificate"},
		{"bad server-addr", func(c *Config) { c.ServerAddr = []string{"10.0.0.1:6443"} }, "want https://host:port"},
		{"no threshold", func(c *Config) { c.Kubeconfig = "/kc"; c.UnhealthyThreshold = 0 }, "--unhealthy-threshold"},
		{"no data dir", func(c *Config) { c.Kubeconfig = "/kc"; c.DataDir = "" }, "--data-dir is empty"},
		{"no cert", func(c *Config) { c.Cert = "" }, "give --cert and --key"},
		{"no key", func(c *Config) { c.Key = "" }, "give --cert and --key"},
		{"bad gateway", func(c *Config) { c.Gateway = []string{"gw:http"} }, "--gateway"},
		{"no ports", func(c *Config) { c.AllowPorts = nil }, "--allow-ports is empty"},
		{"bad pod ports", func(c *Config) { c.AllowPodPorts = "http" }, `--allow-pod-ports: "http": not a port number`},
		{"empty pod ports", func(c *Config) { c.AllowPodPorts = "" }, "--allow-pod-ports: empty"},
		{"bad admin", func(c *Config) { c.AdminListen = "10267" }, "--admin-listen"},
		{"edge services without proxy", func(c *Config) { c.EdgeServices = true }, "--edge-services needs --gateway"},
		{"edge services on one address", func(c *Config) { c.Kubeconfig = "/kc"; c.EdgeServices = true; c.ServiceListen = "127.0.0.1:10271" },
			"listen on the wildcard address"},
		{"edge services no port", func(c *Config) { c.Kubeconfig = "/kc"; c.EdgeServices = true; c.ServiceListen = ":0" }, "--service-listen"},
		{"edge services streams", func(c *Config) { c.Kubeconfig = "/kc"; c.EdgeServices = true; c.MaxServiceStreams = 0 }, "--max-service-streams 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.change(&c)
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestPorts(t *testing.T) {
	var p Ports
	if err := p.Set("10250, 10255,9100"); err != nil || p.String() != "10250,10255,9100" {
		t.Errorf("Set: %v, %v", p, err)
	}
	for _, bad := range []string{"0", "http", "70000", "1,-2"} {
		if err := p.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
	// In the YAML file: a list of numbers, or the flag's string form.
	for file, want := range map[string]Ports{
		"allow-ports: [10250, 9100]\n": {10250, 9100},
		"allow-ports: \"10255\"\n":     {10255},
	} {
		path := filepath.Join(t.TempDir(), "edge.yaml")
		os.WriteFile(path, []byte(file), 0o600)
		cfg := DefaultConfig()
		if err := config.LoadFile(path, &cfg); err != nil {
			t.Fatalf("%q: %v", file, err)
		}
		if diff := cmp.Diff(want, cfg.AllowPorts); diff != "" {
			t.Errorf("%q (-want +got):\n%s", file, diff)
		}
	}
	path := filepath.Join(t.TempDir(), "edge.yaml")
	os.WriteFile(path, []byte("allow-ports: [0]\n"), 0o600)
	cfg := DefaultConfig()
	if err := config.LoadFile(path, &cfg); err == nil {
		t.Error("port 0 accepted")
	}
}

// TestRun starts tether-edge as the command does, from files, against a
// minimal gateway, and checks a stream and the admin endpoints.
func TestRun(t *testing.T) {
	ca := testenv.MustCA(t, "edgeproxy-test")
	dir := t.TempDir()
	node, _ := ca.NodeCert("edge-7")
	pem := filepath.Join(dir, "kubelet-client-current.pem")
	if err := os.WriteFile(pem, append(node.CertPEM, node.KeyPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	caFile, err := ca.WriteFile(dir, "gateway-ca")
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := ca.ServerCert("gateway", "gw.test")
	ln, err := quic.ListenAddr("127.0.0.1:0",
		tunnel.ServerTLS(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &srv.TLS, nil }, ca.Pool()),
		tunnel.QUICConfig(tunnel.Limits{}))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dest, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer dest.Close()
	go func() {
		if c, err := dest.Accept(); err == nil {
			c.Write([]byte("hello from the kubelet"))
			c.Close()
		}
	}()
	destAP := dest.Addr().(*net.TCPAddr).AddrPort()
	adminAddr := freePort(t)

	cfg := DefaultConfig()
	cfg.Gateway = []string{ln.Addr().String()}
	cfg.GatewayCA = caFile
	cfg.GatewayServerName = "gw.test"
	cfg.Cert, cfg.Key = pem, pem
	cfg.AllowPorts = Ports{destAP.Port()}
	cfg.AdminListen = adminAddr
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	actx, acancel := context.WithTimeout(ctx, 10*time.Second)
	defer acancel()
	conn, err := ln.Accept(actx)
	if err != nil {
		t.Fatal(err)
	}
	s, err := conn.OpenStreamSync(actx)
	if err != nil {
		t.Fatal(err)
	}
	tunnel.WriteRequest(s, tunnel.Request{Dest: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), destAP.Port())})
	s.Close()
	s.SetReadDeadline(time.Now().Add(10 * time.Second))
	if rep, err := tunnel.ReadReply(s); err != nil {
		t.Fatalf("reply %+v, %v", rep, err)
	}
	if b, _ := io.ReadAll(s); string(b) != "hello from the kubelet" {
		t.Errorf("relayed %q", b)
	}

	get := func(path string) (int, string) {
		var resp *http.Response
		// The admin listener is up once Run got that far.
		testenv.EventuallyNoError(t, "GET "+path, func() (err error) {
			resp, err = http.Get("http://" + adminAddr + path)
			return err
		})
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/readyz"); code != 200 {
		t.Errorf("/readyz: %d %s", code, body)
	}
	_, body := get("/status")
	var st statusapi.Edge
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("/status: %v: %s", err, body)
	}
	if st.Node != "edge-7" || len(st.Gateways) != 1 || !st.Gateways[0].Connected || st.Gateways[0].Streams != 1 {
		t.Errorf("/status: %s", body)
	}
	if _, body := get("/metrics"); !strings.Contains(body, `tether_edge_tunnel_streams_total{result="ok"} 1`) ||
		!strings.Contains(body, "tether_edge_tunnel_gateway_connected{gateway=") {
		t.Errorf("/metrics lacks the tunnel's series")
	}
}

func TestRunRefusesACertificateThatIsNotANode(t *testing.T) {
	ca := testenv.MustCA(t, "edgeproxy-test")
	kp, _ := ca.ClientCert("admin", "system:masters")
	certFile, keyFile, err := kp.WriteFiles(t.TempDir(), "admin")
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Gateway = []string{"127.0.0.1:1"}
	cfg.Cert, cfg.Key = certFile, keyFile
	cfg.AdminListen = ""
	cfg.Logger = slog.New(slog.DiscardHandler)
	err = Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "cannot register with a gateway") {
		t.Errorf("err = %v", err)
	}
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// nodeKubeconfig writes a kubeconfig for api into dir, with node's
// certificate and key in files of their own as kubelet's, and returns the
// three paths.
func nodeKubeconfig(t *testing.T, dir string, api *httptest.Server, node *testenv.KeyPair) (kubeconfig, certFile, keyFile string) {
	t.Helper()
	certFile, keyFile, err := node.WriteFiles(dir, "kubelet-client")
	if err != nil {
		t.Fatal(err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: api.URL,
		CertificateAuthorityData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: api.Certificate().Raw})}
	kc.AuthInfos["u"] = &clientcmdapi.AuthInfo{ClientCertificate: certFile, ClientKey: keyFile}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	kc.CurrentContext = "c"
	kubeconfig = filepath.Join(dir, "kubelet.conf")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	return kubeconfig, certFile, keyFile
}

// TestRunAPIServerProxyOnly starts tether-edge with a kubeconfig and no
// gateway, against a minimal apiserver, and checks the proxy and its
// admin endpoints.
func TestRunAPIServerProxyOnly(t *testing.T) {
	var lastSerial atomic.Pointer[big.Int] // of the client certificate of the last configmap request
	api := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/default/configmaps/") {
			lastSerial.Store(r.TLS.PeerCertificates[0].SerialNumber)
		}
		switch {
		case r.URL.Path == "/readyz":
			w.Write([]byte("ok"))
		case r.URL.Path == "/api/v1/namespaces/default/configmaps/x" && r.TLS != nil && len(r.TLS.PeerCertificates) == 1 &&
			r.TLS.PeerCertificates[0].Subject.CommonName == "system:node:edge-9":
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x","namespace":"default","resourceVersion":"5"}}`))
		default:
			http.Error(w, "no", http.StatusForbidden)
		}
	}))
	api.EnableHTTP2 = true
	api.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	api.StartTLS()
	defer api.Close()

	dir := t.TempDir()
	ca := testenv.MustCA(t, "edgeproxy-test")
	node, _ := ca.NodeCert("edge-9")
	kubeconfig, certFile, keyFile := nodeKubeconfig(t, dir, api, node)

	cfg := DefaultConfig()
	cfg.Kubeconfig = kubeconfig
	cfg.APIServerListen = freePort(t)
	cfg.AdminListen = freePort(t)
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.CertCheckInterval.Duration = 50 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	get := func(url, ua string) (int, string) {
		t.Helper()
		var resp *http.Response
		testenv.EventuallyNoError(t, "GET "+url, func() (err error) {
			req, _ := http.NewRequest("GET", url, nil)
			req.Header.Set("User-Agent", ua)
			resp, err = http.DefaultClient.Do(req)
			return err
		})
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("http://"+cfg.APIServerListen+"/api/v1/namespaces/default/configmaps/x", "kubelet/v1.36.3"); code != 200 || !strings.Contains(body, `"name":"x"`) {
		t.Errorf("through the proxy: %d %s", code, body)
	}
	if code, body := get("http://"+cfg.AdminListen+"/readyz", ""); code != 200 {
		t.Errorf("/readyz: %d %s", code, body)
	}
	_, body := get("http://"+cfg.AdminListen+"/status", "")
	var st statusapi.Edge
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("/status: %v: %s", err, body)
	}
	if st.Node != "edge-9" || st.APIServer == nil || len(st.APIServer.Servers) != 1 || !st.APIServer.Servers[0].Healthy {
		t.Errorf("/status: %s", body)
	}
	if _, body := get("http://"+cfg.AdminListen+"/metrics", ""); !strings.Contains(body, `tether_edge_apiserver_requests_total{component="kubelet",served="upstream",verb="get"} 1`) ||
		!strings.Contains(body, "tether_edge_apiserver_upstream_healthy{server=") {
		t.Errorf("/metrics lacks the proxy's series:\n%s", body)
	}
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "apiserver-cache.db")); err != nil {
		t.Errorf("cache file: %v", err)
	}

	// kubelet rotates its client certificate in place: requests move to a
	// connection that presents the new one, although the HTTP/2
	// connection up since the start would serve them.
	if s := lastSerial.Load(); s == nil || s.Cmp(node.Cert.SerialNumber) != 0 {
		t.Fatalf("the first request presented serial %v, want %v", s, node.Cert.SerialNumber)
	}
	rotated, _ := ca.NodeCert("edge-9")
	if err := os.WriteFile(keyFile, rotated.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, rotated.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "requests presenting the rotated certificate", func() bool {
		if code, body := get("http://"+cfg.APIServerListen+"/api/v1/namespaces/default/configmaps/x", "kubelet/v1.36.3"); code != 200 {
			t.Fatalf("after the rotation: %d %s", code, body)
		}
		return lastSerial.Load().Cmp(rotated.Cert.SerialNumber) == 0
	})
}
