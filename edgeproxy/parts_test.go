package edgeproxy

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tether-edge/tether/internal/testenv"
)

// TestRunReadinessFromItsParts: /readyz asks each part; with no gateway
// reachable it names the tunnel.
func TestRunReadinessFromItsParts(t *testing.T) {
	ca := testenv.MustCA(t, "edgeproxy-test")
	dir := t.TempDir()
	node, _ := ca.NodeCert("edge-8")
	pem := filepath.Join(dir, "kubelet-client-current.pem")
	if err := os.WriteFile(pem, append(node.CertPEM, node.KeyPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Gateway = []string{"127.0.0.1:1"} // nothing answers there
	cfg.Cert, cfg.Key = pem, pem
	cfg.AdminListen = freePort(t)
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
	var resp *http.Response
	testenv.EventuallyNoError(t, "GET /readyz", func() (err error) {
		resp, err = http.Get("http://" + cfg.AdminListen + "/readyz")
		return err
	})
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "tunnel: not connected to any gateway") {
		t.Errorf("/readyz: %d %s", resp.StatusCode, b)
	}
}
