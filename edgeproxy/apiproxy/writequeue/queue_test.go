package writequeue

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-edge/tether/edgeproxy/apiproxy/internal/statuspatch"
	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/internal/localapi"
	"github.com/tether-edge/tether/internal/testenv"
)

// fakeAPIServer keeps pods by name and answers a get of one and a patch
// of its status, as kube-apiserver does for the replay; it can answer
// chosen writes 503 a number of times, and records the writes applied.
type fakeAPIServer struct {
	*httptest.Server
	mu      sync.Mutex
	pods    map[string][]byte
	rv      int
	refuse  map[string]int // pod name: writes still to answer 503
	applied []string       // pod names, in the order their writes were applied
}

func newFakeAPIServer(t *testing.T, pods ...string) *fakeAPIServer {
	f := &fakeAPIServer{pods: map[string][]byte{}, refuse: map[string]int{}}
	for _, p := range pods {
		f.pods[p] = pod(p, "Pending", 1)
	}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func pod(name, phase string, rv int) []byte {
	return fmt.Appendf(nil, `{"kind":"Pod","apiVersion":"v1","metadata":{"name":%q,"namespace":"ns","uid":"uid-%s","resourceVersion":"%d"},"status":{"phase":%q}}`,
		name, name, rv, phase)
}

func (f *fakeAPIServer) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rest, ok := strings.CutPrefix(r.URL.Path, "/api/v1/namespaces/ns/pods/")
	name, _, _ := strings.Cut(rest, "/")
	obj := f.pods[name]
	if !ok || obj == nil {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if r.Method == http.MethodGet {
		w.Write(obj)
		return
	}
	if f.refuse[name] > 0 {
		f.refuse[name]--
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"kind":"Status","apiVersion":"v1","message":"busy"}`))
		return
	}
	body, _ := io.ReadAll(r.Body)
	out, err := statuspatch.Apply(r.Header.Get("Content-Type"), obj, body, "pods")
	if err != nil {
		http.Error(w, err.Error(), http.StatusUnprocessableEntity)
		return
	}
	f.rv++
	out, _ = localapi.WithResourceVersion(out, uint64(100+f.rv), "", "")
	f.pods[name] = out
	f.applied = append(f.applied, name)
	w.Write(out)
}

func (f *fakeAPIServer) phase(name string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var o struct {
		Status struct{ Phase string } `json:"status"`
	}
	json.Unmarshal(f.pods[name], &o)
	return o.Status.Phase
}

func (f *fakeAPIServer) order() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.applied...)
}

// fakeUpstream is a cloud whose health the test sets.
type fakeUpstream struct {
	u       *url.URL
	mu      sync.Mutex
	healthy bool
	changed chan struct{}
}

func (u *fakeUpstream) Server() (*url.URL, bool) { return u.u, u.Healthy() }
func (u *fakeUpstream) Kick()                    {}

func (u *fakeUpstream) Healthy() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.healthy
}

func (u *fakeUpstream) Changed() <-chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.changed
}

func (u *fakeUpstream) set(healthy bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.healthy = healthy
	close(u.changed)
	u.changed = make(chan struct{})
}

// start builds a queue on a new store, the cloud unhealthy, and runs it.
func start(t *testing.T, api *fakeAPIServer) (*Queue, *fakeUpstream, *cache.Store, *prometheus.Registry) {
	t.Helper()
	store, err := cache.Open(filepath.Join(t.TempDir(), cache.FileName), nil)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(api.URL)
	up := &fakeUpstream{u: u, changed: make(chan struct{})}
	reg := prometheus.NewRegistry()
	q, err := New(Options{Store: store, Upstream: up, Transport: api.Client().Transport, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		q.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		store.Close()
	})
	return q, up, store, reg
}

// patch queues a merge patch of name's phase, as the proxy does: base
// is the pod as it had it, the result the pod patched.
func patch(t *testing.T, q *Queue, name string, base []byte, phase string) []byte {
	t.Helper()
	body := fmt.Appendf(nil, `{"status":{"phase":%q}}`, phase)
	result, err := statuspatch.Apply(statuspatch.JSONMerge, base, body, "pods")
	if err != nil {
		t.Fatal(err)
	}
	w := &cache.QueuedWrite{Component: "kubelet", UserAgent: "kubelet/v1.36.3", Method: http.MethodPatch,
		Path: "/api/v1/namespaces/ns/pods/" + name + "/status", ContentType: statuspatch.JSONMerge, Body: body,
		Version: "v1", Resource: "pods", Namespace: "ns", Name: name, UID: "uid-" + name, QueuedAt: time.Now()}
	if err := q.Enqueue(w, base, result); err != nil {
		t.Fatal(err)
	}
	return result
}

// TestCoalesceAndReplay queues patches of two pods offline: each pod's
// later patches take the place of its first, and once the cloud is back
// one write per pod is applied, with the last patch's effect, and the
// ledger balances.
func TestCoalesceAndReplay(t *testing.T) {
	api := newFakeAPIServer(t, "a", "b")
	q, up, store, reg := start(t, api)
	for _, name := range []string{"a", "b"} {
		obj := pod(name, "Pending", 1)
		for _, phase := range []string{"Running", "Failed", "Succeeded"} {
			obj = patch(t, q, name, obj, phase+"-"+name)
		}
	}
	if n := q.Len(); n != 2 {
		t.Fatalf("%d writes queued, want one per pod", n)
	}
	if !q.Queued(Object{Resource: "pods", Namespace: "ns", Name: "a"}) || q.Queued(Object{Resource: "pods", Namespace: "ns", Name: "c"}) {
		t.Errorf("Queued says a: %v, c: %v", q.Queued(Object{Resource: "pods", Namespace: "ns", Name: "a"}),
			q.Queued(Object{Resource: "pods", Namespace: "ns", Name: "c"}))
	}
	if c := metric(t, reg, "tether_edge_apiserver_queue_replayed_total", replayCoalesced); c != 4 {
		t.Errorf("%v coalesced, want 4", c)
	}

	up.set(true)
	testenv.Eventually(t, "the queue to drain", func() bool { return q.Len() == 0 })
	for _, name := range []string{"a", "b"} {
		if got := api.phase(name); got != "Succeeded-"+name {
			t.Errorf("pod %s upstream in phase %q, want the last patch's", name, got)
		}
	}
	l, err := store.Ledger()
	if err != nil {
		t.Fatal(err)
	}
	if want := (cache.Ledger{Enqueued: 6, Coalesced: 4, Applied: 2}); l != want || !l.Balanced() {
		t.Errorf("ledger %v, want %v", l, want)
	}
	if a, l := metric(t, reg, "tether_edge_apiserver_queue_replayed_total", replayApplied), metric(t, reg, "tether_edge_apiserver_queue_length", ""); a != 2 || l != 0 {
		t.Errorf("metrics: %v applied, queue length %v; want 2 and 0", a, l)
	}
	if st := q.Ledger(); st == nil || !st.Balanced || st.Applied != 2 {
		t.Errorf("/status's ledger: %+v", st)
	}
}

// TestReplayBacksOffPerWrite has the cloud refuse one pod's write 503
// once: the other pod's write, queued later, is applied first, and the
// refused one after its backoff. A 503 does not say whether the write
// was applied, so its retry is counted as resent.
func TestReplayBacksOffPerWrite(t *testing.T) {
	api := newFakeAPIServer(t, "stuck", "free")
	api.refuse["stuck"] = 1
	q, up, store, _ := start(t, api)
	patch(t, q, "stuck", pod("stuck", "Pending", 1), "Running")
	patch(t, q, "free", pod("free", "Pending", 1), "Running")
	up.set(true)
	testenv.Eventually(t, "the queue to drain", func() bool { return q.Len() == 0 })
	if got := api.order(); len(got) != 2 || got[0] != "free" || got[1] != "stuck" {
		t.Errorf("writes applied in the order %v, want free, then stuck after its backoff", got)
	}
	l, err := store.Ledger()
	if err != nil {
		t.Fatal(err)
	}
	if want := (cache.Ledger{Enqueued: 2, Applied: 2, Resent: 1}); l != want {
		t.Errorf("ledger %v, want %v", l, want)
	}
}

// metric reads a series of reg: a counter by its result label, or a
// gauge without labels.
func metric(t *testing.T, reg *prometheus.Registry, name, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if result == "" {
				return m.GetGauge().GetValue()
			}
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "result" && lp.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
