package world

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/tether-edge/tether/internal/testenv"
)

// Get fetches url with a plain HTTP client whose sockets live in h (for
// the admin endpoints of the programs running there).
func Get(ctx context.Context, h *testenv.Host, url string) (string, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: h.DialContext}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return string(b), fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}

// GatewayAdmin is the URL of path on gw's admin endpoint.
func GatewayAdmin(gw *testenv.Host, path string) string {
	return fmt.Sprintf("http://%s:%d%s", gw.Addr, AdminPort, path)
}

// EdgeAdmin is the URL of path on an edge's admin endpoint (loopback of
// its host).
func EdgeAdmin(path string) string { return "http://127.0.0.1:10267" + path }

// Metric returns the value of the sample in a Prometheus text exposition
// whose name and labels are exactly series (`name{a="b"}`), or 0.
func Metric(exposition, series string) float64 {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	m := re.FindStringSubmatch(exposition)
	if m == nil {
		return 0
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// ResolveVia makes h's resolver the DNS server of gw, searching zone, the
// way an operator points a host or CoreDNS at the gateway: `ip netns exec`
// puts /etc/netns/<ns>/resolv.conf over /etc/resolv.conf for the commands
// it runs there. Removed at cleanup.
func ResolveVia(t testenv.T, h *testenv.Host, gw *testenv.Host, zone string) {
	t.Helper()
	dir := filepath.Join("/etc/netns", h.Name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	conf := fmt.Sprintf("nameserver %s\nsearch %s\noptions timeout:1 attempts:2\n", gw.Addr, strings.TrimSuffix(zone, "."))
	if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte(conf), 0o644); err != nil {
		t.Fatalf("%v", err)
	}
}
