package cache

import (
	"bytes"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	bolt "go.etcd.io/bbolt"
	"k8s.io/apimachinery/pkg/runtime/schema"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/internal/localapi"
)

var (
	epslices = schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}
	configs  = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
)

// testEpoch is when tests' fake clocks start.
var testEpoch = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// counter reads a counter's value.
func counter(t testing.TB, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	must(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

// logBuffer is a slog handler's output, safe for the writer goroutine.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// openBounded opens a store with options, a fake clock and its log in a
// buffer.
func openBounded(t testing.TB, path string, o Options) (*Store, *testingclock.FakeClock, *logBuffer) {
	t.Helper()
	clk := testingclock.NewFakeClock(testEpoch)
	logs := &logBuffer{}
	o.Clock, o.Logger = clk, slog.New(slog.NewTextHandler(logs, nil))
	s, err := OpenWith(path, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, clk, logs
}

// settle waits until the writer has committed what was submitted and
// kept the bounds after it (it does so after each batch, before the
// next).
func settle(t testing.TB, s *Store) {
	t.Helper()
	must(t, s.Sync())
	must(t, s.Sync())
}

// bigList is a complete list of n objects of about size bytes each.
func bigList(t testing.TB, ns, prefix string, n, size int, rv uint64) List {
	pad := strings.Repeat("x", size)
	l := List{Kind: "Pod", APIVersion: "v1", RV: rv + uint64(n), Complete: true, Scope: Scope{Namespace: ns}}
	for i := range n {
		raw := fmt.Appendf(nil, `{"metadata":{"name":"%s%d","namespace":%q,"resourceVersion":"%d"},"pad":%q}`, prefix, i, ns, rv+uint64(i), pad)
		o, err := localapi.DecodeObject(raw, "Pod", "v1")
		must(t, err)
		l.Items = append(l.Items, o)
	}
	return l
}

// Past the bound whole resources go, least recently updated first, until
// the data is back under it; queued writes stay; an evicted resource is
// not served (not even after watch events refill part of it) until a
// complete list fills it again.
func TestBoundEvictsWholeResources(t *testing.T) {
	const max = 3 << 20
	s, clk, logs := openBounded(t, filepath.Join(t.TempDir(), FileName), Options{MaxSize: max, noCompact: true})
	for i := range 20 {
		must(t, s.Enqueue(&QueuedWrite{Method: "PATCH", Name: fmt.Sprint("w", i), Body: bytes.Repeat([]byte("q"), 10<<10)}))
	}
	// Oldest first: coredns's slices, then kube-proxy's, then kubelet's
	// pods, an hour apart; each about 1 MiB.
	must(t, s.ApplyList("coredns", epslices, bigList(t, "a", "s", 250, 4000, 100)))
	settle(t, s)
	clk.Step(time.Hour)
	must(t, s.ApplyList("kube-proxy", epslices, bigList(t, "a", "s", 250, 4000, 100)))
	settle(t, s)
	clk.Step(time.Hour)
	must(t, s.ApplyList("kubelet", pods, bigList(t, "ns", "p", 250, 4000, 100)))
	must(t, s.ApplyList("kubelet", configs, bigList(t, "ns", "c", 10, 100, 100)))
	settle(t, s)
	if _, used := s.Usage(); used > max {
		t.Fatalf("%d bytes of data, bound %d", used, max)
	}
	if _, found := s.Info("coredns", epslices); found {
		t.Error("the least recently updated resource was not evicted")
	}
	for _, r := range []struct {
		comp string
		gvr  schema.GroupVersionResource
		n    int
	}{{"kubelet", pods, 250}, {"kubelet", configs, 10}} {
		items, _, found, err := s.List(r.comp, r.gvr, Scope{})
		if err != nil || !found || len(items) != r.n {
			t.Errorf("%s %s: %d items, found %v, %v; want all %d", r.comp, r.gvr.Resource, len(items), found, err, r.n)
		}
	}
	if n := len(queued(t, s)); n != 20 {
		t.Errorf("%d queued writes after eviction, want 20", n)
	}
	if n := counter(t, s.upkeep.evictions.WithLabelValues("coredns")); n != 1 {
		t.Errorf("coredns evictions counted %v", n)
	}
	if !strings.Contains(logs.String(), "evicted whole resources") || !strings.Contains(logs.String(), "coredns discovery.k8s.io/v1/endpointslices") {
		t.Errorf("the eviction was not logged with what went:\n%s", logs)
	}

	// A watch event refills part of it: still not served.
	must(t, s.Put("coredns", epslices, pod(t, "a", "s1", 900, "n", nil)))
	settle(t, s)
	if _, found := s.Info("coredns", epslices); found {
		t.Error("an evicted resource is served after a watch event (it holds one object of 250)")
	}
	if _, _, found, _ := s.List("coredns", epslices, Scope{}); found {
		t.Error("an evicted resource is listed after a watch event")
	}
	if o, _ := s.Get("coredns", epslices, "a", "s1"); o == nil || o.RV != 900 {
		t.Errorf("the object the watch event brought: %+v", o)
	}
	// A complete list fills it: served again, exactly the list.
	l := bigList(t, "a", "s", 3, 10, 1000)
	must(t, s.ApplyList("coredns", epslices, l))
	settle(t, s)
	items, info, found, err := s.List("coredns", epslices, Scope{})
	if err != nil || !found || len(items) != 3 || info.MaxRV != l.RV {
		t.Errorf("after a complete list: %v, found %v, %+v, %v", names(items), found, info, err)
	}
}

// The queue is never evicted, even when it alone is over the bound: every
// resource goes, the queue stays, and it is said (once).
func TestBoundNeverEvictsQueue(t *testing.T) {
	const max = 1 << 20
	path := filepath.Join(t.TempDir(), FileName)
	s, _, logs := openBounded(t, path, Options{MaxSize: max, noCompact: true})
	must(t, s.ApplyList("kubelet", pods, bigList(t, "ns", "p", 20, 1000, 1)))
	body := bytes.Repeat([]byte("q"), 50<<10)
	for i := range 40 { // 2 MiB
		must(t, s.Enqueue(&QueuedWrite{Method: "PATCH", Name: fmt.Sprint("w", i), Body: body}))
	}
	for range 3 {
		must(t, s.Put("kubelet", pods, pod(t, "ns", "late", 500, "n", nil)))
		settle(t, s)
	}
	q := queued(t, s)
	if len(q) != 40 {
		t.Fatalf("%d queued writes, want all 40", len(q))
	}
	for i, w := range q {
		if w.Name != fmt.Sprint("w", i) || !bytes.Equal(w.Body, body) {
			t.Fatalf("queued write %d: %s, %d bytes", i, w.Name, len(w.Body))
		}
	}
	if _, found := s.Info("kubelet", pods); found {
		t.Error("pods still served with the cache over its bound")
	}
	// The pod the watch event brought back each time went again, but
	// the resource was evicted (and counted) once.
	if n := counter(t, s.upkeep.evictions.WithLabelValues("kubelet")); n != 1 {
		t.Errorf("kubelet evictions counted %v, want 1", n)
	}
	if o, _ := s.Get("kubelet", pods, "ns", "late"); o != nil {
		t.Error("what watch events refilled of an evicted resource stays over the bound")
	}
	if n := strings.Count(logs.String(), "nothing left to evict"); n != 1 {
		t.Errorf("'nothing left to evict' logged %d times, want once:\n%s", n, logs)
	}
	// And the queue survives a reopen.
	must(t, s.Close())
	s2, _, _ := openBounded(t, path, Options{MaxSize: max})
	if n := len(queued(t, s2)); n != 40 {
		t.Errorf("%d queued writes after reopening, want 40", n)
	}
}

// Tombstones expire after their TTL, so that deleted objects of a
// component that never lists again do not pile up; until then an older
// version stays out. MaxRV never goes back.
func TestTombstonesExpire(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s, clk, _ := openBounded(t, path, Options{TombstoneTTL: time.Hour})
	must(t, s.Put("kubelet", pods, pod(t, "ns", "a", 10, "n", nil)))
	must(t, s.Delete("kubelet", pods, pod(t, "ns", "a", 20, "n", nil), true))
	// A tombstone of an older version, without a time: it counts from
	// the open.
	putRaw(t, s, []string{"objects", "kubelet", string(resourceKey(pods))}, []byte("ns/old"), encodeRecord(flagTombstone, &localapi.Object{RV: 15}))
	settle(t, s)
	tombstones := func() int {
		n := 0
		s.db.View(func(tx *bolt.Tx) error {
			b := objectsBucket(tx, "kubelet", pods)
			return b.ForEach(func(_, v []byte) error {
				if v[0] == flagTombstone {
					n++
				}
				return nil
			})
		})
		return n
	}

	clk.Step(50 * time.Minute)
	must(t, s.Put("kubelet", pods, pod(t, "ns", "a", 15, "n", nil))) // late, older than the deletion
	settle(t, s)
	if o, _ := s.Get("kubelet", pods, "ns", "a"); o != nil {
		t.Fatalf("a version older than the deletion came back within the TTL: %d", o.RV)
	}
	if n := tombstones(); n != 2 {
		t.Fatalf("%d tombstones within the TTL, want 2", n)
	}

	clk.Step(20 * time.Minute)
	must(t, s.Bookmark("kubelet", pods, "Pod", "v1", 30))
	settle(t, s)
	if n := tombstones(); n != 0 {
		t.Errorf("%d tombstones after the TTL, want 0", n)
	}
	if n := counter(t, s.upkeep.expired); n != 2 {
		t.Errorf("expired tombstones counted %v, want 2", n)
	}
	if info, _ := s.Info("kubelet", pods); info.MaxRV != 30 {
		t.Errorf("MaxRV %d after expiry, want 30", info.MaxRV)
	}
}

// An update bumps the resource's time only when something changed, or a
// minute after the last.
func TestResourceUpdatedTime(t *testing.T) {
	s, clk, _ := openBounded(t, filepath.Join(t.TempDir(), FileName), Options{})
	must(t, s.Put("kubelet", pods, pod(t, "ns", "a", 10, "n", nil)))
	settle(t, s)
	t0 := clk.Now().Unix()
	clk.Step(30 * time.Second)
	must(t, s.Put("kubelet", pods, pod(t, "ns", "a", 10, "n", nil))) // the same version
	settle(t, s)
	if info, _ := s.Info("kubelet", pods); info.Updated != t0 {
		t.Errorf("updated %d after an unchanged put, want %d", info.Updated, t0)
	}
	clk.Step(time.Minute)
	must(t, s.Put("kubelet", pods, pod(t, "ns", "a", 10, "n", nil)))
	settle(t, s)
	if info, _ := s.Info("kubelet", pods); info.Updated != clk.Now().Unix() {
		t.Errorf("updated %d a minute later, want %d", info.Updated, clk.Now().Unix())
	}
}
