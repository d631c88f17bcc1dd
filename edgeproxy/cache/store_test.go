package cache

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/internal/localapi"
)

var pods = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

// podJSON is a pod as a list item (no kind) or, with typed, an object.
func podJSON(ns, name string, rv uint64, node string, lbls map[string]string, typed bool) []byte {
	var l []string
	for k, v := range lbls {
		l = append(l, fmt.Sprintf("%q:%q", k, v))
	}
	slices.Sort(l)
	tm := ""
	if typed {
		tm = `"kind":"Pod","apiVersion":"v1",`
	}
	return fmt.Appendf(nil, `{%s"metadata":{"name":%q,"namespace":%q,"uid":"uid-%s","resourceVersion":"%d","labels":{%s}},"spec":{"nodeName":%q,"hostNetwork":true,"priority":7}}`,
		tm, name, ns, name, rv, strings.Join(l, ","), node)
}

func pod(t testing.TB, ns, name string, rv uint64, node string, lbls map[string]string) *localapi.Object {
	t.Helper()
	o, err := localapi.DecodeObject(podJSON(ns, name, rv, node, lbls, false), "Pod", "v1")
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func openT(t testing.TB, path string) *Store {
	t.Helper()
	s, err := Open(path, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func names(items []*localapi.Object) []string {
	var out []string
	for _, o := range items {
		out = append(out, o.Key())
	}
	slices.Sort(out)
	return out
}

func TestResourceVersionNeverGoesBackwards(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	must(t, s.Put("kubelet", pods, pod(t, "ns", "a", 10, "n", nil)))
	must(t, s.Put("kubelet", pods, pod(t, "ns", "a", 5, "old", nil)))
	must(t, s.Sync())
	got, err := s.Get("kubelet", pods, "ns", "a")
	if err != nil || got == nil || got.RV != 10 || got.Field("spec.nodeName") != "n" {
		t.Fatalf("after an older put: %+v, %v", got, err)
	}
	// Deleted at 12: the version of 11 a slow response carries stays out;
	// a recreation (13) gets in.
	must(t, s.Delete("kubelet", pods, pod(t, "ns", "a", 12, "n", nil), true))
	must(t, s.Put("kubelet", pods, pod(t, "ns", "a", 11, "n", nil)))
	must(t, s.Put("kubelet", pods, pod(t, "ns", "a", 12, "n", nil)))
	must(t, s.Sync())
	if got, _ := s.Get("kubelet", pods, "ns", "a"); got != nil {
		t.Fatalf("resurrected by an older version: %+v", got)
	}
	must(t, s.Put("kubelet", pods, pod(t, "ns", "a", 13, "n", nil)))
	must(t, s.Sync())
	if got, _ := s.Get("kubelet", pods, "ns", "a"); got == nil || got.RV != 13 {
		t.Fatalf("recreation not cached: %+v", got)
	}
	if info, ok := s.Info("kubelet", pods); !ok || info.MaxRV != 13 || info.Kind != "Pod" {
		t.Errorf("info %+v %v", info, ok)
	}
	// Other components do not see it.
	if got, _ := s.Get("kube-proxy", pods, "ns", "a"); got != nil {
		t.Errorf("kube-proxy sees kubelet's object")
	}
}

// An object answered locally offline has a made-up resourceVersion: the
// cloud's next version replaces it, and it is not the list's.
func TestLocalObjects(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	must(t, s.Put("kubelet", pods, pod(t, "ns", "a", 40, "n", nil)))
	must(t, s.PutLocal("kubelet", pods, pod(t, "ns", "a", 41, "local", nil)))
	must(t, s.PutLocal("kubelet", pods, pod(t, "ns", "b", 500, "local", nil)))
	must(t, s.Sync())
	if got, _ := s.Get("kubelet", pods, "ns", "a"); got == nil || got.Field("spec.nodeName") != "local" {
		t.Fatalf("local answer not served: %+v", got)
	}
	if info, _ := s.Info("kubelet", pods); info.MaxRV != 40 {
		t.Errorf("MaxRV %d: raised by a made-up resourceVersion", info.MaxRV)
	}
	must(t, s.Put("kubelet", pods, pod(t, "ns", "a", 41, "cloud", nil)))
	// A complete list at 100 without b: b goes, though "newer".
	must(t, s.ApplyList("kubelet", pods, List{Kind: "Pod", APIVersion: "v1", RV: 100, Complete: true,
		Items: []*localapi.Object{pod(t, "ns", "a", 41, "cloud", nil)}, Scope: Scope{Fields: fields.OneTermEqualSelector("spec.nodeName", "local")}}))
	must(t, s.Sync())
	if got, _ := s.Get("kubelet", pods, "ns", "a"); got == nil || got.Field("spec.nodeName") != "cloud" {
		t.Errorf("the cloud's version did not replace the local one: %+v", got)
	}
	if got, _ := s.Get("kubelet", pods, "ns", "b"); got != nil {
		t.Errorf("local b survived a list without it")
	}
}

func TestListReplacesOnlyWhatItCovers(t *testing.T) {
	s := openT(t, filepath.Join(t.TempDir(), FileName))
	web := map[string]string{"app": "web"}
	db := map[string]string{"app": "db"}
	must(t, s.ApplyList("kubelet", pods, List{Kind: "Pod", APIVersion: "v1", RV: 100, Complete: true, Items: []*localapi.Object{
		pod(t, "a", "web-1", 50, "n1", web), pod(t, "a", "db-1", 51, "n1", db),
		pod(t, "b", "web-2", 52, "n1", web), pod(t, "b", "web-3", 53, "n2", web),
	}}))
	// A newer event for web-2 arrives before an older list without it.
	must(t, s.Put("kubelet", pods, pod(t, "b", "web-2", 120, "n1", web)))
	// A complete list of app=web pods in namespace a and b at 110 without
	// web-1... only namespace b is listed: web-3 goes, web-2 (newer) stays.
	must(t, s.ApplyList("kubelet", pods, List{Kind: "Pod", APIVersion: "v1", RV: 110, Complete: true,
		Scope: Scope{Namespace: "b", Labels: labels.SelectorFromSet(web)}}))
	// A page is not complete: nothing goes.
	must(t, s.ApplyList("kubelet", pods, List{Kind: "Pod", APIVersion: "v1", RV: 115, Scope: Scope{Namespace: "a"}}))
	must(t, s.Sync())

	all, info, found, err := s.List("kubelet", pods, Scope{})
	if err != nil || !found {
		t.Fatal(found, err)
	}
	if diff := slices.Compare(names(all), []string{"a/db-1", "a/web-1", "b/web-2"}); diff != 0 {
		t.Errorf("cached %v", names(all))
	}
	if info.MaxRV != 120 {
		t.Errorf("MaxRV %d, want 120", info.MaxRV)
	}

	// Selectors never used before are answered from the same objects.
	for _, tc := range []struct {
		scope Scope
		want  []string
	}{
		{Scope{Labels: labels.SelectorFromSet(db)}, []string{"a/db-1"}},
		{Scope{Namespace: "a", Fields: fields.OneTermEqualSelector("spec.nodeName", "n1")}, []string{"a/db-1", "a/web-1"}},
		{Scope{Fields: fields.OneTermNotEqualSelector("metadata.name", "web-1")}, []string{"a/db-1", "b/web-2"}},
		{Scope{Namespace: "c"}, nil},
	} {
		got, _, _, err := s.List("kubelet", pods, tc.scope)
		if err != nil || slices.Compare(names(got), tc.want) != 0 {
			t.Errorf("List(%+v) = %v, %v; want %v", tc.scope, names(got), err, tc.want)
		}
	}
	if _, _, found, _ := s.List("kubelet", schema.GroupVersionResource{Version: "v1", Resource: "secrets"}, Scope{}); found {
		t.Error("secrets found though never cached")
	}

	// The end of initial events prunes like a list.
	must(t, s.Prune("kubelet", pods, Scope{Namespace: "a"}, 130, map[string]bool{"a/web-1": true}))
	must(t, s.Sync())
	got, _, _, _ := s.List("kubelet", pods, Scope{})
	if slices.Compare(names(got), []string{"a/web-1", "b/web-2"}) != 0 {
		t.Errorf("after Prune: %v", names(got))
	}
}

func TestReopenKeepsCacheAndQueue(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s, err := Open(path, nil)
	must(t, err)
	must(t, s.Put("kubelet", pods, pod(t, "ns", "a", 7, "n", nil)))
	for i := range 3 {
		must(t, s.Enqueue(&QueuedWrite{Method: "PATCH", Name: fmt.Sprint("w", i), Body: []byte("{}")}))
	}
	q := queued(t, s)
	must(t, s.Dequeue(q[0].Seq, OutcomeApplied))
	must(t, s.Close())
	if err := s.Put("kubelet", pods, pod(t, "ns", "b", 7, "n", nil)); err != ErrClosed {
		t.Errorf("Put after Close: %v", err)
	}

	s = openT(t, path)
	if s.MovedAside != "" {
		t.Errorf("a good file was moved aside")
	}
	if got, _ := s.Get("kubelet", pods, "ns", "a"); got == nil {
		t.Error("object lost across reopen")
	}
	q = queued(t, s)
	if len(q) != 2 || q[0].Name != "w1" || q[1].Name != "w2" || q[0].Seq >= q[1].Seq || s.QueueLen() != 2 {
		t.Errorf("queue after reopen: %+v", q)
	}
	must(t, s.Enqueue(&QueuedWrite{Name: "w3"}))
	if q := queued(t, s); q[len(q)-1].Seq <= q[len(q)-2].Seq {
		t.Errorf("sequence went back after reopen: %+v", q)
	}
}

func TestCorruptFileMovedAside(t *testing.T) {
	for name, content := range map[string]func(good []byte) []byte{
		"garbage":   func([]byte) []byte { return bytes.Repeat([]byte("not a bbolt file "), 1000) },
		"truncated": func(good []byte) []byte { return good[:len(good)/3] },
		"scribbled": func(good []byte) []byte {
			bad := bytes.Clone(good)
			for i := 4096 * 2; i < len(bad); i += 97 {
				bad[i] ^= 0xa5
			}
			return bad
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, FileName)
			s, err := Open(path, nil)
			must(t, err)
			for i := range 200 {
				must(t, s.Put("kubelet", pods, pod(t, "ns", fmt.Sprint("p", i), uint64(i+1), "n", nil)))
			}
			must(t, s.Close())
			good, _ := os.ReadFile(path)
			must(t, os.WriteFile(path, content(good), 0o600))

			var logs bytes.Buffer
			s, err = Open(path, slog.New(slog.NewTextHandler(&logs, nil)))
			if err != nil {
				t.Fatalf("Open of a corrupt file: %v", err)
			}
			defer s.Close()
			if s.MovedAside == "" {
				t.Fatal("corrupt file not moved aside")
			}
			if _, err := os.Stat(s.MovedAside); err != nil {
				t.Errorf("moved-aside file: %v", err)
			}
			if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), s.MovedAside) {
				t.Errorf("log does not say where the file went: %s", logs.String())
			}
			must(t, s.Put("kubelet", pods, pod(t, "ns", "fresh", 1, "n", nil)))
			must(t, s.Sync())
			if got, _ := s.Get("kubelet", pods, "ns", "fresh"); got == nil {
				t.Error("rebuilt store does not serve")
			}
		})
	}
}

func TestUnknownSchemaMovedAside(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s, err := Open(path, nil)
	must(t, err)
	must(t, s.write(func(tx *bolt.Tx) error { s.dirty = true; return tx.Bucket(bucketMeta).Put(keySchema, []byte("99")) }))
	must(t, s.Close())
	s = openT(t, path)
	if s.MovedAside == "" {
		t.Error("file of schema 99 kept")
	}
}

func TestLockedFileIsAnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	openT(t, path)
	start := time.Now()
	_, err := Open(path, nil)
	if err == nil || !strings.Contains(err.Error(), "locked by another process") {
		t.Fatalf("second Open: %v", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Errorf("took %v", time.Since(start))
	}
	if m, _ := filepath.Glob(path + ".corrupt-*"); len(m) > 0 {
		t.Errorf("a locked file was moved aside: %v", m)
	}
}

// A damaged record is an error, never a panic.
func TestRecordDecoding(t *testing.T) {
	o := pod(t, "ns", "a", 7, "edge-1", map[string]string{"app": "web", "tier": "x"})
	rec := encodeRecord(flagObject, o)
	r, ok := decodeRecord(rec)
	if !ok {
		t.Fatal("record does not decode")
	}
	got, err := r.object()
	if err != nil || got.Name != "a" || got.Namespace != "ns" || got.UID != "uid-a" || got.RV != 7 || got.Kind != "Pod" ||
		got.Labels["tier"] != "x" || got.Indexed["spec.nodeName"] != "edge-1" || got.Indexed["status.phase"] != "" || string(got.Raw) != string(o.Raw) {
		t.Errorf("round trip: %+v, %v", got, err)
	}
	for n := range len(rec) {
		if r, ok := decodeRecord(rec[:n]); ok {
			r.object()
		}
		bad := bytes.Clone(rec)
		bad[n] ^= 0xff
		if r, ok := decodeRecord(bad); ok {
			r.object()
		}
	}
}
