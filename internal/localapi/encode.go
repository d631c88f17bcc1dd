package localapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Watch event types, as kube-apiserver sends them.
const (
	Added    = "ADDED"
	Modified = "MODIFIED"
	Deleted  = "DELETED"
	Bookmark = "BOOKMARK"
	Error    = "ERROR"
)

// ListHead is the start of a list answer, up to its items: listKind
// ("PodList") and apiVersion at resourceVersion rv.
func ListHead(listKind, apiVersion string, rv uint64) []byte {
	b := append([]byte(`{"kind":`), strconv.Quote(listKind)...)
	b = append(b, `,"apiVersion":`...)
	b = strconv.AppendQuote(b, apiVersion)
	b = append(b, `,"metadata":{"resourceVersion":"`...)
	b = strconv.AppendUint(b, rv, 10)
	return append(b, `"},"items":[`...)
}

// ListTail ends a list answer.
const ListTail = "]}\n"

// WriteList writes a list answer in one page, as kube-apiserver writes
// it: the envelope of ListHead around items (each an object's JSON with
// kind and apiVersion), with its Content-Length.
func WriteList(w http.ResponseWriter, listKind, apiVersion string, rv uint64, items [][]byte) {
	head := ListHead(listKind, apiVersion, rv)
	n := len(head) + len(ListTail) + max(len(items)-1, 0)
	for _, it := range items {
		n += len(it)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(n))
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write(head); err != nil {
		return
	}
	for i, it := range items {
		if i > 0 {
			w.Write(comma)
		}
		if _, err := w.Write(it); err != nil {
			return
		}
	}
	w.Write([]byte(ListTail))
}

var comma = []byte{','}

// AppendEvent appends a watch event of type typ and object obj (its
// JSON), with the newline that ends it.
func AppendEvent(b []byte, typ string, obj []byte) []byte {
	b = append(b, `{"type":"`...)
	b = append(b, typ...)
	b = append(b, `","object":`...)
	b = append(b, obj...)
	return append(b, "}\n"...)
}

// BookmarkKind says what a BOOKMARK event marks.
type BookmarkKind uint8

const (
	// ProgressBookmark marks progress only: a resourceVersion to resume
	// the watch from.
	ProgressBookmark BookmarkKind = iota
	// InitialEventsEnd also ends a watch's initial events (with
	// sendInitialEvents): it carries metav1.InitialEventsAnnotationKey.
	InitialEventsEnd
)

// AppendBookmark appends a BOOKMARK event of kind bk at resourceVersion rv
// for objects of kind and apiVersion.
func AppendBookmark(b []byte, kind, apiVersion string, rv uint64, bk BookmarkKind) []byte {
	b = append(b, `{"type":"BOOKMARK","object":{"kind":`...)
	b = strconv.AppendQuote(b, kind)
	b = append(b, `,"apiVersion":`...)
	b = strconv.AppendQuote(b, apiVersion)
	b = append(b, `,"metadata":{"resourceVersion":"`...)
	b = strconv.AppendUint(b, rv, 10)
	b = append(b, '"')
	if bk == InitialEventsEnd {
		b = append(b, `,"annotations":{"`+metav1.InitialEventsAnnotationKey+`":"true"}`...)
	}
	return append(b, "}}}\n"...)
}

// BookmarkInfo is what the object of a BOOKMARK event says.
type BookmarkInfo struct {
	// Kind and APIVersion of the watched objects.
	Kind, APIVersion string
	// RV is the resourceVersion reached (0 if it is not a number).
	RV uint64
	// Marks is what the bookmark marks.
	Marks BookmarkKind
}

// ReadBookmark reads the object of a BOOKMARK event, as AppendBookmark
// writes it. The object has no name; only JSON that does not decode is
// an error.
func ReadBookmark(obj []byte) (BookmarkInfo, error) {
	var b struct {
		Kind       string `json:"kind"`
		APIVersion string `json:"apiVersion"`
		Metadata   struct {
			ResourceVersion string            `json:"resourceVersion"`
			Annotations     map[string]string `json:"annotations"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(obj, &b); err != nil {
		return BookmarkInfo{}, fmt.Errorf("decode bookmark: %w", err)
	}
	info := BookmarkInfo{Kind: b.Kind, APIVersion: b.APIVersion, RV: ParseRV(b.Metadata.ResourceVersion)}
	if b.Metadata.Annotations[metav1.InitialEventsAnnotationKey] == "true" {
		info.Marks = InitialEventsEnd
	}
	return info, nil
}

// AppendErrorEvent appends the ERROR event that ends a watch, with err as
// a metav1.Status (see StatusOf): apierrors.NewResourceExpired is the 410
// Gone that makes a client relist.
func AppendErrorEvent(b []byte, err error) []byte {
	st, _ := json.Marshal(StatusOf(err))
	return AppendEvent(b, Error, st)
}

// StatusOf returns err as a metav1.Status with its type meta: the status
// of an *apierrors.StatusError, or an internal error.
func StatusOf(err error) metav1.Status {
	var se *apierrors.StatusError
	if !errors.As(err, &se) {
		se = apierrors.NewInternalError(err)
	}
	st := se.ErrStatus
	st.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	return st
}

// WriteStatus writes err as kube-apiserver writes a failure: a
// metav1.Status (StatusOf) with its code.
func WriteStatus(w http.ResponseWriter, err error) {
	st := StatusOf(err)
	b, _ := json.Marshal(st)
	WriteJSON(w, int(st.Code), b)
}

// WriteJSON writes a JSON answer with its Content-Length.
func WriteJSON(w http.ResponseWriter, code int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(code)
	w.Write(body)
}
