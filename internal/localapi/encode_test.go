package localapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
)

// A list answer reads as kube-apiserver's, with its Content-Length.
func TestWriteList(t *testing.T) {
	for _, items := range [][][]byte{nil, {[]byte(`{"metadata":{"name":"a"}}`)}, {[]byte(`{"metadata":{"name":"a"}}`), []byte(`{"metadata":{"name":"b"}}`)}} {
		w := httptest.NewRecorder()
		WriteList(w, "PodList", "v1", 42, items)
		body := w.Body.Bytes()
		if w.Header().Get("Content-Length") != strconv.Itoa(len(body)) || w.Header().Get("Content-Type") != "application/json" || w.Code != http.StatusOK {
			t.Errorf("%d items: headers %v, code %d, %d bytes", len(items), w.Header(), w.Code, len(body))
		}
		var l metav1.PartialObjectMetadataList
		if err := json.Unmarshal(body, &l); err != nil || l.Kind != "PodList" || l.APIVersion != "v1" || l.ResourceVersion != "42" || len(l.Items) != len(items) {
			t.Errorf("%d items: %s: %+v %v", len(items), body, l, err)
		}
	}
	if got, want := string(ListHead("PodList", "v1", 7))+ListTail, `{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[]}`+"\n"; got != want {
		t.Errorf("empty list %q, want %q", got, want)
	}
}

// Watch events, bookmarks and the ERROR event of a 410 read as
// client-go reads kube-apiserver's.
func TestWatchEvents(t *testing.T) {
	var b []byte
	b = AppendEvent(b, Added, []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"a"}}`))
	b = AppendBookmark(b, "Pod", "v1", 9, InitialEventsEnd)
	b = AppendBookmark(b, "Pod", "v1", 10, ProgressBookmark)
	b = AppendErrorEvent(b, apierrors.NewResourceExpired("too old resource version: 1"))
	dec := json.NewDecoder(bytes.NewReader(b))
	var evs []metav1.WatchEvent
	for dec.More() {
		var ev metav1.WatchEvent
		if err := dec.Decode(&ev); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		evs = append(evs, ev)
	}
	if len(evs) != 4 || evs[0].Type != string(watch.Added) || evs[1].Type != string(watch.Bookmark) || evs[3].Type != string(watch.Error) {
		t.Fatalf("events %s", b)
	}
	var bm metav1.PartialObjectMetadata
	if err := json.Unmarshal(evs[1].Object.Raw, &bm); err != nil || bm.Kind != "Pod" || bm.ResourceVersion != "9" ||
		bm.Annotations[metav1.InitialEventsAnnotationKey] != "true" {
		t.Errorf("bookmark %s: %v", evs[1].Object.Raw, err)
	}
	var plain metav1.PartialObjectMetadata
	if err := json.Unmarshal(evs[2].Object.Raw, &plain); err != nil || plain.ResourceVersion != "10" || len(plain.Annotations) != 0 {
		t.Errorf("bookmark %s: %v", evs[2].Object.Raw, err)
	}
	var st metav1.Status
	if err := json.Unmarshal(evs[3].Object.Raw, &st); err != nil || st.Code != http.StatusGone || st.Reason != metav1.StatusReasonExpired || st.Kind != "Status" {
		t.Errorf("error event %s: %v", evs[3].Object.Raw, err)
	}
}

// ReadBookmark reads back what AppendBookmark writes.
func TestReadBookmark(t *testing.T) {
	for _, bk := range []BookmarkKind{ProgressBookmark, InitialEventsEnd} {
		var ev metav1.WatchEvent
		if err := json.Unmarshal(AppendBookmark(nil, "EndpointSlice", "discovery.k8s.io/v1", 12, bk), &ev); err != nil {
			t.Fatal(err)
		}
		got, err := ReadBookmark(ev.Object.Raw)
		if want := (BookmarkInfo{"EndpointSlice", "discovery.k8s.io/v1", 12, bk}); err != nil || got != want {
			t.Errorf("ReadBookmark(%s) = %+v, %v; want %+v", ev.Object.Raw, got, err, want)
		}
	}
	if _, err := ReadBookmark([]byte(`{"metadata":`)); err == nil {
		t.Error("a bookmark that does not decode was read")
	}
}

func TestWriteStatus(t *testing.T) {
	w := httptest.NewRecorder()
	WriteStatus(w, apierrors.NewNotFound(schemaGR, "p"))
	var st metav1.Status
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil || w.Code != http.StatusNotFound || st.Code != http.StatusNotFound ||
		st.Kind != "Status" || st.APIVersion != "v1" || st.Reason != metav1.StatusReasonNotFound {
		t.Errorf("%d %s: %v", w.Code, w.Body, err)
	}
	w = httptest.NewRecorder()
	WriteStatus(w, errPlain)
	if w.Code != http.StatusInternalServerError {
		t.Errorf("a plain error: %d %s", w.Code, w.Body)
	}
}

var (
	schemaGR = schema.GroupResource{Resource: "pods"}
	errPlain = errors.New("disk on fire")
)
