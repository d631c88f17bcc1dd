package admin

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestEndpoints(t *testing.T) {
	reg := NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	var ready atomic.Bool
	h := New(Options{
		Registry: reg,
		Ready: func() error {
			if !ready.Load() {
				return errors.New("informer not synced")
			}
			return nil
		},
		Status: func() any { return map[string]int{"edges": 2} },
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- ServeListener(ctx, ln, h) }()
	base := "http://" + ln.Addr().String()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		path     string
		code     int
		contains string
	}{
		{"/healthz", 200, "ok"},
		{"/readyz", 503, "informer not synced"},
		{"/metrics", 200, "tether_test_total 3"},
		{"/metrics", 200, "go_goroutines"},
		{"/status", 200, `"edges": 2`},
	} {
		code, body := get(tc.path)
		if code != tc.code || !strings.Contains(body, tc.contains) {
			t.Errorf("GET %s = %d %q; want %d containing %q", tc.path, code, body, tc.code, tc.contains)
		}
	}
	ready.Store(true)
	if code, _ := get("/readyz"); code != 200 {
		t.Errorf("/readyz after ready = %d", code)
	}
	cancel()
	if err := <-served; err != nil {
		t.Errorf("serve returned %v after shutdown", err)
	}
}

// Profiles are served only when asked for.
func TestProfiling(t *testing.T) {
	for _, on := range []bool{false, true} {
		h := New(Options{Registry: NewRegistry(), Profiling: on})
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/goroutine?debug=1"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
			if want := map[bool]int{false: 404, true: 200}[on]; rec.Code != want {
				t.Errorf("profiling %v: GET %s = %d, want %d", on, path, rec.Code, want)
			}
		}
	}
}
