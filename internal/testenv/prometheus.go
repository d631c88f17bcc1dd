package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// PrometheusPort is the port StartPrometheus serves on, on the loopback of
// its host.
const PrometheusPort = 9090

// Prometheus is a Prometheus server (from Binaries, without its web UI)
// running in a Host's network namespace: it scrapes from there, and its
// HTTP API answers on loopback there.
type Prometheus struct {
	Host *Host
	Cmd  *exec.Cmd
	// URL is the API's base URL inside Host, http://127.0.0.1:9090.
	URL string
	// Dir holds prometheus.yml and the TSDB.
	Dir    string
	client *http.Client
}

// StartPrometheus writes config as prometheus.yml and starts Prometheus
// with it in h; it returns once /-/ready answers.
func StartPrometheus(t T, h *Host, config string) *Prometheus {
	t.Helper()
	bin := Binaries(t).Prometheus
	dir, err := os.MkdirTemp("", "tether-prometheus-")
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	file := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(file, []byte(config), 0o644); err != nil {
		t.Fatalf("%v", err)
	}
	p := &Prometheus{
		Host:   h,
		URL:    "http://127.0.0.1:" + strconv.Itoa(PrometheusPort),
		Dir:    dir,
		client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: h.DialContext}},
	}
	p.Cmd = h.Start(t, bin,
		"--config.file="+file,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address=127.0.0.1:"+strconv.Itoa(PrometheusPort),
	)
	EventuallyNoError(t, "Prometheus ready in "+h.String(), func() error {
		if h.Exited(p.Cmd) {
			return nil
		}
		_, err := p.get(context.Background(), "/-/ready")
		return err
	})
	if h.Exited(p.Cmd) {
		t.Fatalf("prometheus in %s exited:\n%s", h, tail(h.Log(p.Cmd), logTail))
	}
	return p
}

// Log is Prometheus's output so far.
func (p *Prometheus) Log() string { return p.Host.Log(p.Cmd) }

// PromSample is one series of an instant query's result.
type PromSample struct {
	Labels map[string]string
	Value  float64
}

// Query evaluates an instant query (GET /api/v1/query) and returns its
// vector; another result type is an error.
func (p *Prometheus) Query(ctx context.Context, expr string) ([]PromSample, error) {
	body, err := p.get(ctx, "/api/v1/query?query="+url.QueryEscape(expr))
	if err != nil {
		return nil, err
	}
	var resp struct {
		Data struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("query %q: %w", expr, err)
	}
	if resp.Data.ResultType != "vector" {
		return nil, fmt.Errorf("query %q: result type %q, want vector", expr, resp.Data.ResultType)
	}
	var out []PromSample
	for _, r := range resp.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("query %q: value %v: %w", expr, r.Value[1], err)
		}
		out = append(out, PromSample{Labels: r.Metric, Value: v})
	}
	return out, nil
}

// PromSeries is one series of a range vector, with its raw samples.
type PromSeries struct {
	Labels map[string]string
	Points []PromPoint
}

// PromPoint is one sample of a PromSeries.
type PromPoint struct {
	Time  time.Time
	Value float64
}

// Samples evaluates expr, a range vector such as `up[5m]`, as an instant
// query at time at, and returns every raw sample of the window (a
// result of another type is an error): what an instant query cannot
// say, such as a quantile over all the scrapes of many targets.
func (p *Prometheus) Samples(ctx context.Context, expr string, at time.Time) ([]PromSeries, error) {
	q := url.Values{"query": {expr}, "time": {strconv.FormatFloat(float64(at.UnixMilli())/1000, 'f', 3, 64)}}
	body, err := p.get(ctx, "/api/v1/query?"+q.Encode())
	if err != nil {
		return nil, err
	}
	var resp struct {
		Data struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Metric map[string]string `json:"metric"`
				Values [][2]any          `json:"values"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("query %q: %w", expr, err)
	}
	if resp.Data.ResultType != "matrix" {
		return nil, fmt.Errorf("query %q: result type %q, want matrix", expr, resp.Data.ResultType)
	}
	out := make([]PromSeries, 0, len(resp.Data.Result))
	for _, r := range resp.Data.Result {
		ser := PromSeries{Labels: r.Metric, Points: make([]PromPoint, 0, len(r.Values))}
		for _, v := range r.Values {
			ts, ok := v[0].(float64)
			s, _ := v[1].(string)
			f, err := strconv.ParseFloat(s, 64)
			if !ok || err != nil {
				return nil, fmt.Errorf("query %q: sample %v", expr, v)
			}
			ser.Points = append(ser.Points, PromPoint{Time: time.UnixMilli(int64(math.Round(ts * 1000))), Value: f})
		}
		out = append(out, ser)
	}
	return out, nil
}

// PromTarget is an active scrape target (GET /api/v1/targets).
type PromTarget struct {
	DiscoveredLabels map[string]string `json:"discoveredLabels"`
	Labels           map[string]string `json:"labels"`
	ScrapePool       string            `json:"scrapePool"`
	ScrapeURL        string            `json:"scrapeUrl"`
	// Health is "up", "down" or "unknown" (not scraped yet).
	Health    string `json:"health"`
	LastError string `json:"lastError"`
}

// Targets lists the active targets, those service discovery found and
// relabelling kept.
func (p *Prometheus) Targets(ctx context.Context) ([]PromTarget, error) {
	body, err := p.get(ctx, "/api/v1/targets?state=active")
	if err != nil {
		return nil, err
	}
	var resp struct {
		Data struct {
			ActiveTargets []PromTarget `json:"activeTargets"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("targets: %w", err)
	}
	return resp.Data.ActiveTargets, nil
}

// get fetches path of the API and returns the body of a 200 answer.
func (p *Prometheus) get(ctx context.Context, path string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %.200s", path, resp.Status, body)
	}
	return body, nil
}
