package e2e

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-edge/tether/e2e/world"
	"github.com/tether-edge/tether/internal/testenv"
)

// newWorld is a world with the gateways and edges running and the client
// routed to the first gateway.
func newWorld(t *testing.T, opts world.Options, gatewayArgs ...string) *world.World {
	t.Helper()
	testenv.RequireRoot(t)
	w := world.New(t, bins, opts, t.Logf)
	for _, gw := range w.Gateways {
		w.StartGateway(t, gw, gatewayArgs...)
	}
	for _, e := range w.Edges {
		w.StartEdge(t, e)
	}
	w.RouteSitesVia(t, w.Gateways[0])
	if err := w.WaitReachable(context.Background(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return w
}

// kubeletClient is an HTTPS client on the cloud client host that trusts
// only the kubelets' CA and opens a new connection per request.
func kubeletClient(t *testing.T, w *world.World) *http.Client {
	pem, err := os.ReadFile(w.Path("kubelet-ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &http.Client{
		Timeout: 60 * time.Second,
		Transport: &http.Transport{
			DialContext:       w.Client.DialContext,
			TLSClientConfig:   &tls.Config{RootCAs: pool},
			DisableKeepAlives: true,
		},
	}
}

func TestTunnel(t *testing.T) {
	w := newWorld(t, world.Options{}, "--netrules", "nftables")
	ctx := context.Background()

	t.Run("TLS end to end to each edge's kubelet", func(t *testing.T) {
		for _, e := range w.Edges {
			out, err := w.Curl(ctx, e.KubeletURL("/healthz"))
			if err != nil {
				t.Fatalf("curl %s: %v: %s", e.KubeletURL("/healthz"), err, out)
			}
			if want := "ok " + e.Name; strings.TrimSpace(out) != want {
				t.Errorf("edge %s answered %q, want %q", e.Name, out, want)
			}
		}
	})

	t.Run("1 GiB arrives intact", func(t *testing.T) {
		const n = 1 << 30
		e := w.Edges[0]
		h := sha256.New()
		io.CopyN(h, world.Pattern{}, n)
		want := hex.EncodeToString(h.Sum(nil))
		start := time.Now()
		out, err := w.Client.Command(ctx, "sh", "-c", fmt.Sprintf(
			"curl --silent --show-error --fail --max-time 300 --cacert %s %q | sha256sum",
			w.Path("kubelet-ca.crt"), e.KubeletURL(fmt.Sprintf("/bytes?n=%d", n)))).CombinedOutput()
		if err != nil {
			t.Fatalf("transfer: %v: %s", err, out)
		}
		if got := strings.Fields(string(out))[0]; got != want {
			t.Fatalf("sha256 of 1 GiB through the tunnel = %s, want %s", got, want)
		}
		t.Logf("1 GiB through the tunnel in %v", time.Since(start).Round(time.Millisecond))
	})

	t.Run("200 concurrent connections", func(t *testing.T) {
		c := kubeletClient(t, w)
		var wg sync.WaitGroup
		errs := make(chan error, 200)
		for i := 0; i < 200; i++ {
			e := w.Edges[i%len(w.Edges)]
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := c.Get(e.KubeletURL("/healthz"))
				if err != nil {
					errs <- err
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if strings.TrimSpace(string(body)) != "ok "+e.Name {
					errs <- fmt.Errorf("edge %s answered %q", e.Name, body)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	t.Run("a stalled reader does not slow another connection", func(t *testing.T) {
		e := w.Edges[0]
		c := kubeletClient(t, w)
		// The stalled connection: ask for 512 MiB, read none of it.
		stalled, err := c.Get(e.KubeletURL(fmt.Sprintf("/bytes?n=%d", 512<<20)))
		if err != nil {
			t.Fatal(err)
		}
		defer stalled.Body.Close()
		// It has filled every window on the way once the edge's bytes up
		// stand (nearly) still while a small request crosses.
		up := func() int64 {
			st, err := e.Status(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			var n int64
			for _, g := range st.Gateways {
				n += g.BytesUp
			}
			return n
		}
		testenv.Eventually(t, "the stalled connection's windows full", func() bool {
			before := up()
			resp, err := c.Get(e.KubeletURL("/healthz"))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return before > 0 && up()-before < 64<<10
		})

		const n = 64 << 20
		start := time.Now()
		resp, err := c.Get(e.KubeletURL(fmt.Sprintf("/bytes?n=%d", n)))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || got != n {
			t.Fatalf("second connection moved %d of %d bytes: %v", got, n, err)
		}
		// A shared window would stall this transfer entirely; 64 MiB moves
		// in well under a second here. The bound is generous on purpose.
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("64 MiB beside a stalled reader took %v", d)
		}
	})
}

func TestGatewayRestartEdgesReconnect(t *testing.T) {
	w := newWorld(t, world.Options{}, "--netrules", "nftables")
	gw := w.Gateways[0]
	for _, how := range []string{"SIGTERM", "SIGKILL"} {
		t.Run(how, func(t *testing.T) {
			stop := w.Stop
			if how == "SIGKILL" {
				stop = w.Kill
			}
			stop(gw)
			if how == "SIGTERM" {
				if err := reachable(w, w.Edges[0]); err == nil {
					t.Fatal("edge reachable with the gateway stopped")
				}
			}
			// After SIGKILL the gateway comes back at once, before the
			// edges could notice anything: only its stateless reset (same
			// key as before) tells them that their connections are gone;
			// without it they would wait for the 15 s idle timeout.
			start := time.Now()
			w.StartGateway(t, gw, "--netrules", "nftables")
			if err := w.WaitReachable(context.Background(), 5*time.Second); err != nil {
				t.Fatalf("after restart (%s): %v\ngateway log:\n%s", how, err, w.Log(gw))
			}
			t.Logf("every edge served again %v after the gateway restarted", time.Since(start).Round(time.Millisecond))
		})
	}
}

// reachable reports whether the client host reaches e's kubelet now.
func reachable(w *world.World, e *world.Edge) error {
	out, err := w.Curl(context.Background(), e.KubeletURL("/healthz"), "--max-time", "3")
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}
