package benchkit

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"
)

// DialFunc dials from where a bench's client runs (a testenv.Host's
// DialContext, or a proxy's).
type DialFunc func(ctx context.Context, network, address string) (net.Conn, error)

// NewConnClient is an HTTPS client that makes a new TCP connection and
// TLS handshake for every request (keep-alives off), dialling with dial,
// trusting only roots, each request bounded by timeout (0: none).
func NewConnClient(dial DialFunc, roots *x509.CertPool, timeout time.Duration) *http.Client {
	return &http.Client{
		Transport: &http.Transport{
			DialContext:       dial,
			TLSClientConfig:   &tls.Config{RootCAs: roots},
			DisableKeepAlives: true,
		},
		Timeout: timeout,
	}
}

// Get fetches url with c and returns the body; an answer other than 200
// with a body is an error.
func Get(ctx context.Context, c *http.Client, url string) ([]byte, error) {
	resp, err := get(ctx, c, url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK || len(body) == 0 {
		return body, fmt.Errorf("GET %s: %s %q", url, resp.Status, body)
	}
	return body, nil
}

// SaveURL writes the answer to a GET of url, dialled with dial, into the
// file path (such as a profile from a /debug/pprof endpoint); the whole
// of it within timeout.
func SaveURL(ctx context.Context, dial DialFunc, url, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := getOK(ctx, dial, url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// GetJSON decodes the answer to a GET of url, dialled with dial, into v
// (such as a program's admin /status), within timeout.
func GetJSON(ctx context.Context, dial DialFunc, url string, v any, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := getOK(ctx, dial, url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// getOK GETs url on a connection of its own; an answer other than 200 is
// an error that quotes the start of the body.
func getOK(ctx context.Context, dial DialFunc, url string) (*http.Response, error) {
	resp, err := get(ctx, &http.Client{Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}}, url)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, bytes.TrimSpace(body))
	}
	return resp, nil
}

func get(ctx context.Context, c *http.Client, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	return c.Do(req)
}

// Pct is the p-th percentile (nearest rank) of sorted, or 0 when it is
// empty.
func Pct(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p/100+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}
