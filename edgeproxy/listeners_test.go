package edgeproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-edge/tether/internal/accept/accepttest"
	"github.com/tether-edge/tether/internal/testenv"
)

// TestRunAcceptErrors runs tether-edge with its apiserver proxy, admin
// and pool listeners failing every accept with EMFILE, as in a process
// out of file descriptors, and checks that Run goes on: the clients that
// connected meanwhile are answered once accepting works again, and every
// failure is counted in tether_edge_accept_errors_total.
func TestRunAcceptErrors(t *testing.T) {
	api := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			w.Write([]byte("ok"))
		case "/api/v1/namespaces/default/configmaps/x":
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x","namespace":"default","resourceVersion":"5"}}`))
		default:
			http.Error(w, "no", http.StatusForbidden)
		}
	}))
	api.TLS = &tls.Config{ClientAuth: tls.RequestClientCert}
	api.StartTLS()
	defer api.Close()

	var mu sync.Mutex
	failing := map[string]*accepttest.Listener{}
	orig := listenTCP
	listenTCP = func(name, addr string) (net.Listener, error) {
		ln, err := orig(name, addr)
		if err != nil {
			return nil, err
		}
		fl := accepttest.New(ln, true)
		mu.Lock()
		failing[name] = fl
		mu.Unlock()
		return fl, nil
	}
	t.Cleanup(func() { listenTCP = orig })
	listener := func(name string) *accepttest.Listener {
		mu.Lock()
		defer mu.Unlock()
		return failing[name]
	}

	dir := t.TempDir()
	node, _ := testenv.MustCA(t, "edgeproxy-test").NodeCert("edge-9")
	cfg := DefaultConfig()
	cfg.Kubeconfig, _, _ = nodeKubeconfig(t, dir, api, node)
	cfg.APIServerListen = "127.0.0.1:0"
	cfg.AdminListen = freePort(t)
	cfg.PoolListen = "127.0.0.1:0"
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

	eventually := func(what string, cond func() bool) {
		t.Helper()
		testenv.Eventually(t, what, func() bool {
			select {
			case err := <-done:
				t.Fatalf("Run returned %v while waiting until %s", err, what)
			default:
			}
			return cond()
		})
	}
	// The pool's server starts only once the node's pool is known, which
	// this apiserver never says: its listener is opened (and wrapped) but
	// never accepted from.
	eventually("the listeners are open", func() bool {
		return listener(listenerAPIServer) != nil && listener(listenerAdmin) != nil && listener(listenerPool) != nil
	})
	apiAddr := listener(listenerAPIServer).Addr().String()

	// Clients that connect while accepts fail wait in the backlog.
	send := func(addr, path string) (*bufio.Reader, net.Conn) {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(60 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\nUser-Agent: kubelet/v1.36.3\r\nConnection: close\r\n\r\n", path)
		return bufio.NewReader(c), c
	}
	apiR, _ := send(apiAddr, "/api/v1/namespaces/default/configmaps/x")
	adminR, _ := send(cfg.AdminListen, "/metrics")
	eventually("three accepts failed on each of apiserver and admin", func() bool {
		return listener(listenerAPIServer).Failures() >= 3 && listener(listenerAdmin).Failures() >= 3
	})
	for _, name := range []string{listenerAPIServer, listenerAdmin, listenerPool} {
		listener(name).SetFailing(false)
	}
	for what, r := range map[string]*bufio.Reader{"proxy": apiR, "admin": adminR} {
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("%s: the request sent while accepts failed: %v", what, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		// The proxy answers from the cloud or, if it has not found the
		// cloud healthy yet, refuses: either way it served the request.
		if what == "admin" && resp.StatusCode != 200 {
			t.Errorf("%s: %d %s", what, resp.StatusCode, body)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("Run returned %v", err)
	default:
	}

	resp, err := http.Get("http://" + cfg.AdminListen + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	metrics := string(b)
	for _, name := range []string{listenerAPIServer, listenerAdmin, listenerPool} {
		want := fmt.Sprintf("tether_edge_accept_errors_total{listener=%q} %d\n", name, listener(name).Failures())
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}
