package serve

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/tether-edge/tether/poolstore/replica"
)

// discardWriter is a ResponseWriter that keeps nothing: what the
// handler itself costs.
type discardWriter struct {
	h http.Header
	n int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }

// BenchmarkList lists 1000 EndpointSlices of 3 endpoints each (about
// 1.3 KB of JSON each), as kube-proxy and coredns do at start and on
// every relist.
func BenchmarkList(b *testing.B) {
	s, err := replica.Open(filepath.Join(b.TempDir(), replica.FileName), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	if err := s.StartEpoch("bench"); err != nil {
		b.Fatal(err)
	}
	items := make([]json.RawMessage, 1000)
	for i := range items {
		items[i] = endpointSliceJSON(fmt.Sprint("ns-", i%20), fmt.Sprint("svc-", i, "-abcde"), uint64(i+1),
			fmt.Sprint("svc-", i), "10.1.0.1", "10.1.0.2", "10.1.0.3")
	}
	if err := s.Replace(sliceRes, items, 1000); err != nil {
		b.Fatal(err)
	}
	h := New(s, Options{})
	for _, bc := range []struct{ name, target string }{
		{"all", slicesPath},
		{"kube-proxy-selector", slicesPath + "?labelSelector=%21service.kubernetes.io%2Fheadless%2C%21service.kubernetes.io%2Fservice-proxy-name&resourceVersion=0&limit=500"},
		{"one-namespace", "/apis/discovery.k8s.io/v1/namespaces/ns-3/endpointslices"},
	} {
		b.Run(bc.name+"/handler", func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, bc.target, nil)
			w := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				w.n = 0
				h.ServeHTTP(w, req)
			}
			b.SetBytes(int64(w.n))
		})
	}
	b.Run("all/transport", func(b *testing.B) {
		c := &http.Client{Transport: Transport(h)}
		var n int64
		b.ReportAllocs()
		for b.Loop() {
			resp, err := c.Get("http://pool" + slicesPath)
			if err != nil {
				b.Fatal(err)
			}
			n, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		b.SetBytes(n)
	})
}
