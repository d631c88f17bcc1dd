package edgeproxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-edge/tether/internal/testenv"
)

// TestRunPodAPI starts tether-edge with --pod-api-listen against a
// minimal apiserver: the listener serves TLS with --pod-api-cert,
// refuses a request without a token, relays one with its token and no
// client certificate, and counts both.
func TestRunPodAPI(t *testing.T) {
	api := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			w.Write([]byte("ok"))
			return
		}
		cn := "none"
		if len(r.TLS.PeerCertificates) > 0 {
			cn = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"5","selfLink":%q},"items":[]}`,
			cn+"|"+r.Header.Get("Authorization"))
	}))
	api.EnableHTTP2 = true
	api.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	api.StartTLS()
	defer api.Close()

	dir := t.TempDir()
	ca := testenv.MustCA(t, "edgeproxy-test")
	node, _ := ca.NodeCert("edge-9")
	kubeconfig, _, _ := nodeKubeconfig(t, dir, api, node)
	serving, err := ca.ServerCert("edge-9", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	if cfg.PodAPICert, cfg.PodAPIKey, err = serving.WriteFiles(dir, "pod-api"); err != nil {
		t.Fatal(err)
	}
	cfg.Kubeconfig = kubeconfig
	cfg.APIServerListen = freePort(t)
	cfg.AdminListen = freePort(t)
	cfg.PodAPIListen = freePort(t)
	cfg.DataDir = filepath.Join(dir, "data")
	cfg.Logger = slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	defer client.CloseIdleConnections()
	get := func(url, token string) (int, string) {
		t.Helper()
		var resp *http.Response
		testenv.EventuallyNoError(t, "GET "+url, func() (err error) {
			req, _ := http.NewRequest("GET", url, nil)
			req.Header.Set("User-Agent", "kubelet/v1.36.3")
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err = client.Do(req)
			return err
		})
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	list := "https://" + cfg.PodAPIListen + "/api/v1/namespaces/default/configmaps"
	if code, body := get(list, ""); code != http.StatusUnauthorized {
		t.Errorf("no token: %d %s, want 401", code, body)
	}
	if code, body := get(list, "pod-token"); code != http.StatusOK || !strings.Contains(body, `"none|Bearer pod-token"`) {
		t.Errorf("with a token: %d %s, want the pod's token and no client certificate upstream", code, body)
	}
	testenv.Eventually(t, "the pod requests counted", func() bool {
		_, body := get("http://"+cfg.AdminListen+"/metrics", "")
		return strings.Contains(body, `tether_edge_pod_api_requests_total{served="cloud"} 1`) &&
			strings.Contains(body, `tether_edge_pod_api_requests_total{served="refused"} 1`)
	})
	if _, err := os.Stat(filepath.Join(cfg.DataDir, "pod-api-cache.db")); err != nil {
		t.Errorf("pod cache file: %v", err)
	}
}
