package apiproxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/internal/localapi"
	"github.com/tether-edge/tether/internal/testenv"
)

// undecidedUpstream is a cloud whose first health checks have not come
// back: WaitKnown blocks until its context ends, as when the cloud drops
// packets and the first probe waits for its timeout.
type undecidedUpstream struct{ deadUpstream }

func (undecidedUpstream) WaitKnown(ctx context.Context) { <-ctx.Done() }

// TestCachedReadsDoNotWaitForTheFirstProbe: at start, before the first
// health checks say whether the cloud answers, a cached read is answered
// from the cache after a bounded wait: a kubelet booted in a cut site
// starts at once. (Writes still wait for the verdict.)
func TestCachedReadsDoNotWaitForTheFirstProbe(t *testing.T) {
	store, err := cache.Open(filepath.Join(t.TempDir(), cache.FileName), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	node, err := localapi.DecodeObject([]byte(`{"kind":"Node","apiVersion":"v1","metadata":{"name":"edge-1","uid":"u2","resourceVersion":"11"}}`), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Put("kubelet", nodesGVR, node); err != nil {
		t.Fatal(err)
	}
	if err := store.Sync(); err != nil {
		t.Fatal(err)
	}
	p, err := New(Options{Upstream: undecidedUpstream{}, Store: store, NodeName: "edge-1", Components: DefaultComponents})
	if err != nil {
		t.Fatal(err)
	}

	r := httptest.NewRequest(http.MethodGet, "http://edge/api/v1/nodes/edge-1", nil)
	r.Header.Set("User-Agent", kubeletUA)
	w := httptest.NewRecorder()
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.ServeHTTP(w, r)
	}()
	// The first verdict never comes: only the bounded wait ends the get.
	testenv.Eventually(t, "the cached get answered before the first verdict", func() bool {
		select {
		case <-done:
			return true
		default:
			return false
		}
	})
	if w.Code != http.StatusOK {
		t.Fatalf("get of the cached Node before the first verdict: %d %s, want 200 from the cache", w.Code, w.Body)
	}
	var m dto.Metric
	if err := p.m.requests.WithLabelValues("kubelet", localapi.VerbGet, servedCache).Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
		t.Errorf("the get was not served from the cache")
	}

}
