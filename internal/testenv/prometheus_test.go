package testenv

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestPrometheus starts Prometheus in a namespace, scraping itself and a
// port where nothing listens, and reads both targets' health through its
// API: the binary built without web UI assets serves the API the e2e
// tests use.
func TestPrometheus(t *testing.T) {
	RequireRoot(t)
	h := NewHost(t, "prom")
	p := StartPrometheus(t, h, fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 500ms
scrape_configs:
  - job_name: self
    static_configs: [{targets: ["127.0.0.1:%d"]}]
  - job_name: nobody
    static_configs: [{targets: ["127.0.0.1:1"]}]
`, PrometheusPort))
	ctx := context.Background()
	up := map[string]float64{}
	EventuallyNoError(t, "both targets scraped", func() error {
		samples, err := p.Query(ctx, "up")
		if err != nil {
			return err
		}
		clear(up)
		for _, s := range samples {
			up[s.Labels["job"]] = s.Value
		}
		if len(up) != 2 {
			return fmt.Errorf("up = %v", up)
		}
		return nil
	})
	if up["self"] != 1 || up["nobody"] != 0 {
		t.Errorf("up = %v, want self 1 and nobody 0", up)
	}
	targets, err := p.Targets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	health := map[string]string{}
	for _, tg := range targets {
		health[tg.ScrapeURL] = tg.Health
	}
	want := map[string]string{
		fmt.Sprintf("http://127.0.0.1:%d/metrics", PrometheusPort): "up",
		"http://127.0.0.1:1/metrics":                               "down",
	}
	if fmt.Sprint(health) != fmt.Sprint(want) {
		t.Errorf("targets' health = %v, want %v", health, want)
	}

	// Samples: every scrape of self in a window, one sample each, in
	// time order and inside the window.
	var self []PromPoint
	at := time.Now()
	EventuallyNoError(t, "two scrapes of self in the last 5 s", func() error {
		at = time.Now()
		series, err := p.Samples(ctx, `up{job="self"}[5s]`, at)
		if err != nil {
			return err
		}
		if len(series) != 1 || len(series[0].Points) < 2 {
			return fmt.Errorf("series %v", series)
		}
		self = series[0].Points
		return nil
	})
	for i, pt := range self {
		if pt.Value != 1 || pt.Time.After(at) || pt.Time.Before(at.Add(-5*time.Second)) || (i > 0 && !pt.Time.After(self[i-1].Time)) {
			t.Errorf("up{job=\"self\"}[5s] at %v: sample %d %+v of %+v: want 1, in time order, inside the window", at, i, pt, self)
		}
	}
	if _, err := p.Samples(ctx, "up", at); err == nil {
		t.Error("Samples of an instant vector: no error")
	}
}
