package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/tether-edge/tether/internal/testenv"
	"github.com/tether-edge/tether/poolstore/replica"
)

// watchStream is an open watch: its events as they are decoded.
type watchStream struct {
	t      *testing.T
	events chan watchEvent
	end    chan error // the decoder's last error: io.EOF for a clean end
	cancel context.CancelFunc
}

type watchEvent struct {
	Type   string          `json:"type"`
	Object json.RawMessage `json:"object"`
}

// openWatch starts a watch request with c (Transport by default).
func openWatch(t *testing.T, h http.Handler, target string) *watchStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://pool"+target, nil)
	mustNil(t, err)
	resp, err := (&http.Client{Transport: Transport(h)}).Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		b, _ := io.ReadAll(resp.Body)
		cancel()
		t.Fatalf("watch %s: %s %s", target, resp.Status, b)
	}
	s := &watchStream{t: t, events: make(chan watchEvent, 1000), end: make(chan error, 1), cancel: cancel}
	go func() {
		defer resp.Body.Close()
		d := json.NewDecoder(resp.Body)
		for {
			var ev watchEvent
			if err := d.Decode(&ev); err != nil {
				s.end <- err
				return
			}
			s.events <- ev
		}
	}()
	t.Cleanup(cancel)
	return s
}

// next returns the next event, summed up as "TYPE namespace/name rv".
func (s *watchStream) next() string {
	s.t.Helper()
	select {
	case ev := <-s.events:
		return eventSummary(s.t, ev)
	case err := <-s.end:
		s.t.Fatalf("watch ended waiting for an event: %v", err)
	case <-time.After(10 * time.Second):
		s.t.Fatal("no event within 10 s")
	}
	return ""
}

// nextN returns the next n events.
func (s *watchStream) nextN(n int) []string {
	s.t.Helper()
	var out []string
	for range n {
		out = append(out, s.next())
	}
	return out
}

// ended waits for the end of the watchStream, after any events left.
func (s *watchStream) ended() []string {
	s.t.Helper()
	var out []string
	for {
		select {
		case ev := <-s.events:
			out = append(out, eventSummary(s.t, ev))
		case err := <-s.end:
			if !errors.Is(err, io.EOF) {
				s.t.Fatalf("watch ended with %v", err)
			}
			for len(s.events) > 0 {
				out = append(out, eventSummary(s.t, <-s.events))
			}
			return out
		case <-time.After(10 * time.Second):
			s.t.Fatal("watch did not end within 10 s")
		}
	}
}

func eventSummary(t *testing.T, ev watchEvent) string {
	t.Helper()
	var o struct {
		Kind     string            `json:"kind"`
		Metadata metav1.ObjectMeta `json:"metadata"`
		Code     int               `json:"code"`
		Reason   string            `json:"reason"`
	}
	mustNil(t, json.Unmarshal(ev.Object, &o))
	switch ev.Type {
	case "ERROR":
		return fmt.Sprintf("ERROR %d %s", o.Code, o.Reason)
	case "BOOKMARK":
		s := fmt.Sprintf("BOOKMARK %s %s", o.Kind, o.Metadata.ResourceVersion)
		if o.Metadata.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
			s += " end"
		}
		return s
	}
	return fmt.Sprintf("%s %s/%s %s", ev.Type, o.Metadata.Namespace, o.Metadata.Name, o.Metadata.ResourceVersion)
}

func diffEvents(t *testing.T, what string, want, got []string) {
	t.Helper()
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("%s (-want +got):\n%s", what, d)
	}
}

// TestWatchFromResourceVersion: a watch from X gets exactly the changes
// after X, those already in the log and those to come, in order.
func TestWatchFromResourceVersion(t *testing.T) {
	s := servedStore(t)
	mustNil(t, s.Apply(sliceRes, replica.Modified, endpointSliceJSON("default", "web-abc", 101, "web", "10.0.0.1")))
	mustNil(t, s.Apply(sliceRes, replica.Added, endpointSliceJSON("default", "api-1", 102, "api", "10.0.4.1")))
	mustNil(t, s.Apply(serviceRes, replica.Added, serviceJSON("default", "web", 103))) // another resource
	w := openWatch(t, New(s, Options{}), slicesPath+"?watch=true&resourceVersion=101")
	mustNil(t, s.Apply(sliceRes, replica.Deleted, endpointSliceJSON("default", "db-xyz", 104, "db")))
	mustNil(t, s.Apply(sliceRes, replica.Bookmark, endpointSliceJSON("", "", 105, "")))
	mustNil(t, s.Apply(sliceRes, replica.Modified, endpointSliceJSON("kube-system", "kube-dns-q", 106, "kube-dns", "10.0.2.9")))
	diffEvents(t, "events", []string{
		"ADDED default/api-1 102",
		"DELETED default/db-xyz 104",
		"MODIFIED kube-system/kube-dns-q 106",
	}, w.nextN(3))
}

// TestWatchInitialEvents: resourceVersion "" or "0" begins with the
// objects as ADDED; sendInitialEvents ends them with a bookmark.
func TestWatchInitialEvents(t *testing.T) {
	initial := []string{"ADDED default/db-xyz 11", "ADDED default/web-abc 10", "ADDED kube-system/kube-dns-q 12"}
	for _, tc := range []struct {
		name, query string
		want        []string
	}{
		{"legacy", "watch=1", initial},
		{"resourceVersion 0", "watch=1&resourceVersion=0", initial},
		{"sendInitialEvents", "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
			append(initial, "BOOKMARK EndpointSlice 100 end")},
		{"sendInitialEvents from a resourceVersion", "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion=50",
			append(initial, "BOOKMARK EndpointSlice 100 end")},
		{"sendInitialEvents=false", "watch=1&sendInitialEvents=false&resourceVersionMatch=NotOlderThan", nil},
		{"in a namespace", "watch=1&fieldSelector=metadata.namespace%3Dkube-system", initial[2:]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := servedStore(t)
			w := openWatch(t, New(s, Options{}), slicesPath+"?"+tc.query)
			got := w.nextN(len(tc.want))
			mustNil(t, s.Apply(sliceRes, replica.Added, endpointSliceJSON("kube-system", "new", 101, "new", "10.0.5.1")))
			got = append(got, w.next())
			diffEvents(t, "events", append(tc.want, "ADDED kube-system/new 101"), got)
		})
	}
}

// TestWatchListWaits: sendInitialEvents at a resourceVersion the replica
// has not reached waits for it, then fails as kube-apiserver does.
func TestWatchListWaits(t *testing.T) {
	s := servedStore(t)
	h := New(s, Options{FreshnessWait: 100 * time.Millisecond})
	q := "?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&resourceVersion=500"
	diffEvents(t, "too large", []string{"ERROR 504 Timeout"}, openWatch(t, h, slicesPath+q).ended())

	clk := testingclock.NewFakeClock(time.Now())
	h = New(s, Options{FreshnessWait: time.Minute, Clock: clk})
	w := openWatch(t, h, slicesPath+q) // answered before it waits
	testenv.Eventually(t, "the watch-list waits for 500", clk.HasWaiters)
	s.Replace(sliceRes, nil, 500)
	diffEvents(t, "reached", []string{"BOOKMARK EndpointSlice 500 end"}, w.nextN(1))
}

// TestWatchExpired: a watch from a resourceVersion the log no longer
// reaches gets one ERROR 410 Expired and ends; the client relists.
func TestWatchExpired(t *testing.T) {
	t.Run("follower loaded a snapshot", func(t *testing.T) {
		f := open(t, filepath.Join(t.TempDir(), "f.db"))
		mustNil(t, f.Load(servedStore(t).Snapshot()))
		h := New(f, Options{})
		diffEvents(t, "from 50", []string{"ERROR 410 Expired"}, openWatch(t, h, slicesPath+"?watch=1&resourceVersion=50").ended())
		w := openWatch(t, h, slicesPath+"?watch=1&resourceVersion=100") // the snapshot's: fine
		snap := servedStore(t).Snapshot()
		snap.Resources[sliceRes] = 200
		mustNil(t, f.Load(snap)) // a resync: what happened between 100 and 200 is unknown
		diffEvents(t, "open watch after a new snapshot", []string{"ERROR 410 Expired"}, w.ended())
	})
	t.Run("log compacted", func(t *testing.T) {
		s := servedStore(t)
		for i := range replica.MaxLog {
			mustNil(t, s.Apply(sliceRes, replica.Modified, endpointSliceJSON("default", "web-abc", uint64(101+i), "web", "10.0.0.1")))
		}
		h := New(s, Options{})
		diffEvents(t, "from 100", []string{"ERROR 410 Expired"}, openWatch(t, h, slicesPath+"?watch=1&resourceVersion=100").ended())
		last := fmt.Sprint(100 + replica.MaxLog)
		w := openWatch(t, h, slicesPath+"?watch=1&resourceVersion="+fmt.Sprint(100+replica.MaxLog-1))
		diffEvents(t, "recent", []string{"MODIFIED default/web-abc " + last}, w.nextN(1))
	})
	t.Run("resource dropped", func(t *testing.T) {
		f := open(t, filepath.Join(t.TempDir(), "f.db"))
		mustNil(t, f.Load(servedStore(t).Snapshot()))
		w := openWatch(t, New(f, Options{}), slicesPath+"?watch=1&resourceVersion=100")
		mustNil(t, f.Load(replica.Snapshot{Epoch: "e2", Resources: map[string]uint64{serviceRes: 1}}))
		diffEvents(t, "events", []string{"ERROR 410 Expired"}, w.ended())
	})
}

// TestWatchLabelSelector: objects entering and leaving a label selector
// are sent as ADDED and DELETED, as kube-apiserver does.
func TestWatchLabelSelector(t *testing.T) {
	s := servedStore(t)
	h := New(s, Options{})
	sel := "&labelSelector=kubernetes.io%2Fservice-name%3Dweb"
	fromList := openWatch(t, h, slicesPath+"?watch=1"+sel)
	fromRV := openWatch(t, h, slicesPath+"?watch=1&resourceVersion=100"+sel)
	diffEvents(t, "initial", []string{"ADDED default/web-abc 10"}, fromList.nextN(1))

	// web-abc leaves (now db's), db-xyz enters (now web's), kube-dns-q
	// changes outside, web-abc comes back, db-xyz is deleted.
	mustNil(t, s.Apply(sliceRes, replica.Modified, endpointSliceJSON("default", "web-abc", 101, "db", "10.0.0.1")))
	mustNil(t, s.Apply(sliceRes, replica.Modified, endpointSliceJSON("default", "db-xyz", 102, "web", "10.0.1.1")))
	mustNil(t, s.Apply(sliceRes, replica.Modified, endpointSliceJSON("kube-system", "kube-dns-q", 103, "kube-dns")))
	mustNil(t, s.Apply(sliceRes, replica.Modified, endpointSliceJSON("default", "web-abc", 104, "web", "10.0.0.1")))
	mustNil(t, s.Apply(sliceRes, replica.Deleted, endpointSliceJSON("default", "db-xyz", 105, "web")))
	mustNil(t, s.Apply(sliceRes, replica.Added, endpointSliceJSON("default", "web-new", 106, "web")))
	diffEvents(t, "from the list", []string{
		"DELETED default/web-abc 101",
		"ADDED default/db-xyz 102",
		"ADDED default/web-abc 104",
		"DELETED default/db-xyz 105",
		"ADDED default/web-new 106",
	}, fromList.nextN(5))
	// From a resourceVersion, the labels objects had before are unknown:
	// a first change to a non-matching object is sent as DELETED (a
	// client that does not hold it ignores it), and one to a matching
	// object as it is.
	diffEvents(t, "from a resourceVersion", []string{
		"DELETED default/web-abc 101",
		"MODIFIED default/db-xyz 102",
		"DELETED kube-system/kube-dns-q 103",
		"ADDED default/web-abc 104",
		"DELETED default/db-xyz 105",
		"ADDED default/web-new 106",
	}, fromRV.nextN(6))

	// The DELETED of an object leaving the selector is its last state
	// that matched, at the change's resourceVersion.
	w := openWatch(t, h, slicesPath+"?watch=1"+sel)
	w.nextN(2)
	mustNil(t, s.Apply(sliceRes, replica.Modified, endpointSliceJSON("default", "web-new", 107, "other")))
	ev := <-w.events
	var es struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	mustNil(t, json.Unmarshal(ev.Object, &es))
	if ev.Type != replica.Deleted || es.Metadata.ResourceVersion != "107" || es.Metadata.Labels["kubernetes.io/service-name"] != "web" {
		t.Fatalf("%s %s", ev.Type, ev.Object)
	}
}

// TestWatchBookmarks: bookmarks come every BookmarkInterval with the
// resource's resourceVersion, which bookmarks of the log raise too.
func TestWatchBookmarks(t *testing.T) {
	s := servedStore(t)
	clk := testingclock.NewFakeClock(time.Now())
	h := New(s, Options{Clock: clk, BookmarkInterval: 10 * time.Second})
	w := openWatch(t, h, slicesPath+"?watch=1&resourceVersion=100&allowWatchBookmarks=true")
	none := openWatch(t, h, slicesPath+"?watch=1&resourceVersion=100")
	testenv.EventuallyWithin(t, 10*time.Second, "bookmark tickers", func() bool { return clk.Waiters() == 1 })

	clk.Step(10 * time.Second)
	diffEvents(t, "first", []string{"BOOKMARK EndpointSlice 100"}, w.nextN(1))
	mustNil(t, s.Apply(sliceRes, replica.Bookmark, endpointSliceJSON("", "", 150, "")))
	mustNil(t, s.Apply(serviceRes, replica.Added, serviceJSON("default", "web", 160))) // another resource: not its RV
	clk.Step(10 * time.Second)
	diffEvents(t, "raised by the log", []string{"BOOKMARK EndpointSlice 150"}, w.nextN(1))

	mustNil(t, s.Apply(sliceRes, replica.Added, endpointSliceJSON("default", "api", 170, "api")))
	diffEvents(t, "without bookmarks", []string{"ADDED default/api 170"}, none.nextN(1))
}

// TestWatchTimeout: a watch ends after its timeoutSeconds.
func TestWatchTimeout(t *testing.T) {
	s := servedStore(t)
	clk := testingclock.NewFakeClock(time.Now())
	w := openWatch(t, New(s, Options{Clock: clk}), slicesPath+"?watch=1&resourceVersion=100&timeoutSeconds=30")
	testenv.EventuallyWithin(t, 10*time.Second, "timeout timer", func() bool { return clk.HasWaiters() })
	clk.Step(29 * time.Second)
	mustNil(t, s.Apply(sliceRes, replica.Added, endpointSliceJSON("default", "api", 101, "api")))
	diffEvents(t, "before the timeout", []string{"ADDED default/api 101"}, w.nextN(1))
	clk.Step(time.Second)
	diffEvents(t, "after", nil, w.ended())
}

// TestWatchOverHTTP: the handler behind a real HTTP server streams
// events as they come (chunked, flushed).
func TestWatchOverHTTP(t *testing.T) {
	s := servedStore(t)
	srv := httptest.NewServer(New(s, Options{}))
	t.Cleanup(srv.Close)
	resp, err := http.Get(srv.URL + slicesPath + "?watch=1&resourceVersion=100")
	mustNil(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatal(resp.Status)
	}
	d := json.NewDecoder(resp.Body)
	for i := range 3 {
		mustNil(t, s.Apply(sliceRes, replica.Added, endpointSliceJSON("default", fmt.Sprint("n", i), uint64(101+i), "n")))
		var ev watchEvent
		mustNil(t, d.Decode(&ev))
		if got := eventSummary(t, ev); got != fmt.Sprintf("ADDED default/n%d %d", i, 101+i) {
			t.Fatal(got)
		}
	}
}

// TestWatchOneObject: the deprecated /watch/ path and a get path with
// watch=1 watch one object.
func TestWatchOneObject(t *testing.T) {
	s := servedStore(t)
	h := New(s, Options{})
	legacy := openWatch(t, h, "/apis/discovery.k8s.io/v1/watch/namespaces/default/endpointslices/web-abc")
	named := openWatch(t, h, "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/web-abc?watch=1&resourceVersion=100")
	diffEvents(t, "legacy path", []string{"ADDED default/web-abc 10"}, legacy.nextN(1))
	mustNil(t, s.Apply(sliceRes, replica.Modified, endpointSliceJSON("default", "db-xyz", 101, "db")))
	mustNil(t, s.Apply(sliceRes, replica.Modified, endpointSliceJSON("default", "web-abc", 102, "web")))
	diffEvents(t, "legacy path", []string{"MODIFIED default/web-abc 102"}, legacy.nextN(1))
	diffEvents(t, "named", []string{"MODIFIED default/web-abc 102"}, named.nextN(1))
}
