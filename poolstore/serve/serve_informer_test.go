package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/replica"
)

// requestLog wraps a handler and records what client-go asks of it and
// whether a watch was told its resourceVersion expired.
type requestLog struct {
	h http.Handler

	mu        sync.Mutex
	requests  []string // "list", "watch-list" (sendInitialEvents) or "watch"
	expired   int
	bookmarks int
}

func (l *requestLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	kind := "list"
	switch {
	case q.Get("sendInitialEvents") == "true":
		kind = "watch-list"
	case q.Get("watch") != "":
		kind = "watch"
	}
	l.mu.Lock()
	l.requests = append(l.requests, kind)
	l.mu.Unlock()
	l.h.ServeHTTP(&expiryWatcher{ResponseWriter: w, log: l}, r)
}

func (l *requestLog) count(kind string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, k := range l.requests {
		if k == kind {
			n++
		}
	}
	return n
}

func (l *requestLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.requests)
}

func (l *requestLog) expiredCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expired
}

func (l *requestLog) bookmarkCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bookmarks
}

// expiryWatcher counts the 410 Expired ERROR events and the BOOKMARKs
// written through it.
type expiryWatcher struct {
	http.ResponseWriter
	log *requestLog
}

func (w *expiryWatcher) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.log.mu.Lock()
	if bytes.Contains(p, []byte(`"type":"ERROR"`)) && bytes.Contains(p, []byte(`"code":410`)) {
		w.log.expired++
	}
	w.log.bookmarks += bytes.Count(p, []byte(`"type":"BOOKMARK"`))
	w.log.mu.Unlock()
	return n, err
}

func (w *expiryWatcher) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// clientFor returns a clientset that reaches h in process (Transport,
// as the edge's apiserver proxy does) or over HTTP.
func clientFor(t *testing.T, h http.Handler, via string) kubernetes.Interface {
	t.Helper()
	cfg := &rest.Config{Host: "http://pool.invalid", Transport: Transport(h)}
	if via == "http" {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		cfg = &rest.Config{Host: srv.URL}
	}
	cs, err := kubernetes.NewForConfig(cfg)
	mustNil(t, err)
	return cs
}

// sliceInformer starts an EndpointSlice informer with cs and returns its
// events ("add ns/name rv", "update ...", "delete ...") and its lister.
func sliceInformer(t *testing.T, cs kubernetes.Interface) (<-chan string, func() []string) {
	t.Helper()
	factory := informers.NewSharedInformerFactory(cs, 0)
	inf := factory.Discovery().V1().EndpointSlices()
	events := make(chan string, 1000)
	describe := func(op string, obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		es := obj.(*discoveryv1.EndpointSlice)
		events <- fmt.Sprintf("%s %s/%s %s", op, es.Namespace, es.Name, es.ResourceVersion)
	}
	inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { describe("add", obj) },
		UpdateFunc: func(_, obj any) { describe("update", obj) },
		DeleteFunc: func(obj any) { describe("delete", obj) },
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(factory.Shutdown) // after cancel: cleanups run last first
	t.Cleanup(cancel)
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		t.Fatal("informer did not sync")
	}
	lister := func() []string {
		l, err := inf.Lister().List(labels.Everything())
		mustNil(t, err)
		var out []string
		for _, es := range l {
			out = append(out, es.Namespace+"/"+es.Name+" "+es.ResourceVersion)
		}
		slices.Sort(out)
		return out
	}
	return events, lister
}

func nextEvents(t *testing.T, events <-chan string, n int) []string {
	t.Helper()
	var out []string
	for range n {
		select {
		case e := <-events:
			out = append(out, e)
		case <-time.After(10 * time.Second):
			t.Fatalf("informer events so far %q; want %d", out, n)
		}
	}
	return out
}

// informerModes are client-go's two ways to fill an informer: a
// watch-list (sendInitialEvents, client-go's default since 1.35) and a
// list then a watch.
var informerModes = []struct {
	name      string
	watchList bool
	first     string // the request that fills the informer
}{
	{"watch-list", true, "watch-list"},
	{"list", false, "list"},
}

// TestInformer: a client-go informer of EndpointSlices syncs from the
// handler and follows what the leader applies afterwards.
func TestInformer(t *testing.T) {
	for _, mode := range informerModes {
		for _, via := range []string{"transport", "http"} {
			t.Run(mode.name+"/"+via, func(t *testing.T) {
				clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, mode.watchList)
				s := servedStore(t)
				log := &requestLog{h: New(s, Options{})}
				events, lister := sliceInformer(t, clientFor(t, log, via))
				diffEvents(t, "synced", []string{"default/db-xyz 11", "default/web-abc 10", "kube-system/kube-dns-q 12"}, lister())
				nextEvents(t, events, 3)
				if log.count(mode.first) != 1 {
					t.Fatalf("requests %q: want one %s", log.snapshot(), mode.first)
				}

				mustNil(t, s.Apply(sliceRes, replica.Added, endpointSliceJSON("default", "api-1", 101, "api", "10.0.4.1")))
				mustNil(t, s.Apply(sliceRes, replica.Modified, endpointSliceJSON("default", "web-abc", 102, "web", "10.0.0.1", "10.0.0.3")))
				mustNil(t, s.Apply(sliceRes, replica.Deleted, endpointSliceJSON("default", "db-xyz", 103, "db")))
				diffEvents(t, "events", []string{
					"add default/api-1 101",
					"update default/web-abc 102",
					"delete default/db-xyz 103",
				}, nextEvents(t, events, 3))
				diffEvents(t, "lister", []string{"default/api-1 101", "default/web-abc 102", "kube-system/kube-dns-q 12"}, lister())
			})
		}
	}
}

// TestReflectorRelistsAfterExpired: when the follower's replica is
// resynced from a snapshot, its open watches are told 410 Expired and
// client-go relists, seeing even what the snapshot dropped without an
// event.
func TestReflectorRelistsAfterExpired(t *testing.T) {
	for _, mode := range informerModes {
		t.Run(mode.name, func(t *testing.T) {
			clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, mode.watchList)
			leader := servedStore(t)
			follower := open(t, filepath.Join(t.TempDir(), "follower.db"))
			mustNil(t, follower.Load(leader.Snapshot()))
			log := &requestLog{h: New(follower, Options{})}
			events, lister := sliceInformer(t, clientFor(t, log, "transport"))
			nextEvents(t, events, 3)

			// The follower misses these changes and resyncs from a snapshot.
			mustNil(t, leader.Apply(sliceRes, replica.Deleted, endpointSliceJSON("default", "db-xyz", 101, "db")))
			mustNil(t, leader.Apply(sliceRes, replica.Added, endpointSliceJSON("default", "api-1", 102, "api", "10.0.4.1")))
			mustNil(t, follower.Load(leader.Snapshot()))

			want := []string{"default/api-1 102", "default/web-abc 10", "kube-system/kube-dns-q 12"}
			testenv.EventuallyWithin(t, 10*time.Second, "informer relisted", func() bool { return slices.Equal(lister(), want) })
			if log.count(mode.first) != 2 || log.expiredCount() != 1 {
				t.Fatalf("requests %q, %d expired; want a second %s after one 410", log.snapshot(), log.expiredCount(), mode.first)
			}
			// The relist also sends unchanged objects to UpdateFunc.
			var got []string
			for len(got) < 2 {
				if e := nextEvents(t, events, 1)[0]; !strings.HasPrefix(e, "update ") {
					got = append(got, e)
				}
			}
			slices.Sort(got)
			diffEvents(t, "events", []string{"add default/api-1 102", "delete default/db-xyz 11"}, got)
		})
	}
}

// TestInformerServices: the kinds the handler names for an empty list
// and its bookmarks are those client-go decodes: after some bookmarks, the
// informer is still on its first watch and sees what comes next on it.
func TestInformerServices(t *testing.T) {
	s := servedStore(t)
	log := &requestLog{h: New(s, Options{BookmarkInterval: 10 * time.Millisecond})}
	cs := clientFor(t, log, "transport")
	factory := informers.NewSharedInformerFactory(cs, 0)
	inf := factory.Core().V1().Services()
	added := make(chan string, 10)
	inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(obj any) {
		b, _ := json.Marshal(obj)
		added <- string(b)
	}})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(factory.Shutdown)
	t.Cleanup(cancel)
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.Informer().HasSynced) {
		t.Fatal("informer did not sync")
	}
	// A few bookmarks written after the sync; the event that follows
	// them on the same stream shows the informer read past them.
	synced := log.bookmarkCount()
	testenv.EventuallyWithin(t, 10*time.Second, "three bookmarks after the sync", func() bool { return log.bookmarkCount() >= synced+3 })
	if got := inf.Informer().LastSyncResourceVersion(); got != "90" {
		t.Fatalf("last sync resourceVersion %q, want 90", got)
	}
	mustNil(t, s.Apply(serviceRes, replica.Added, serviceJSON("default", "web", 91)))
	select {
	case <-added:
	case <-time.After(10 * time.Second):
		t.Fatal("service not added")
	}
	// A bookmark client-go could not decode would have ended the watch
	// and made it watch again.
	if watches := log.count("watch") + log.count("watch-list"); watches != 1 {
		t.Fatalf("requests %q: want a single watch", log.snapshot())
	}
}
