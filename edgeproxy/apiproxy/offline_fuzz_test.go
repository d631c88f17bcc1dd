package apiproxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/tether-edge/tether/edgeproxy/apiproxy/writequeue"
	"github.com/tether-edge/tether/edgeproxy/cache"
	"github.com/tether-edge/tether/internal/localapi"
)

// deadUpstream is a cloud that does not answer: unhealthy, or healthy
// by its checks while every request fails.
type deadUpstream struct{ healthy bool }

var _ Upstream = deadUpstream{}

var errRefused = errors.New("connect: connection refused")

func (u deadUpstream) Server() (*url.URL, bool) {
	return &url.URL{Scheme: "https", Host: "192.0.2.1:6443"}, u.healthy
}
func (u deadUpstream) Healthy() bool                             { return u.healthy }
func (deadUpstream) Changed() <-chan struct{}                    { return make(chan struct{}) }
func (deadUpstream) WaitKnown(context.Context)                   {}
func (deadUpstream) Kick()                                       {}
func (deadUpstream) Transport() http.RoundTripper                { return refusing{} }
func (deadUpstream) ReadTransport() http.RoundTripper            { return refusing{} }
func (deadUpstream) UpgradeTransport() http.RoundTripper         { return refusing{} }
func (refusing) RoundTrip(*http.Request) (*http.Response, error) { return nil, errRefused }

type refusing struct{}

// FuzzOfflineWrite sends arbitrary status writes and Lease renewals,
// request line, content type and body, to the proxy while the cloud does
// not answer, with a real cache. What is answered 200 is the object the
// URL names, with a resourceVersion above the cached one, and is what
// the cache then holds; a status write answered 200 is queued, once, as
// sent; anything else is a 400, 413 or 503 that changes neither the
// cache nor the queue.
func FuzzOfflineWrite(f *testing.F) {
	pod := []byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","uid":"u1","resourceVersion":"10"},` +
		`"spec":{"nodeName":"edge-1"},"status":{"phase":"Pending","conditions":[{"type":"Ready","status":"False"}]}}`)
	node := []byte(`{"kind":"Node","apiVersion":"v1","metadata":{"name":"edge-1","uid":"u2","resourceVersion":"11"},` +
		`"status":{"conditions":[{"type":"Ready","status":"True"}]}}`)
	lease := []byte(`{"kind":"Lease","apiVersion":"coordination.k8s.io/v1","metadata":{"name":"edge-1","namespace":"kube-node-lease","resourceVersion":"12"},` +
		`"spec":{"holderIdentity":"edge-1","leaseDurationSeconds":40,"renewTime":"2025-03-01T12:00:00.000000Z"}}`)
	const (
		podStatus  = "/api/v1/namespaces/ns/pods/p/status"
		nodeStatus = "/api/v1/nodes/edge-1/status"
		leasePath  = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/edge-1"
		smp        = "application/strategic-merge-patch+json"
	)
	for _, s := range []struct {
		method, target, ct string
		body               []byte
	}{
		{"PATCH", podStatus, smp, []byte(`{"metadata":{"uid":"u1"},"status":{"conditions":[{"type":"Ready","status":"True"}]}}`)},
		{"PATCH", podStatus, "application/merge-patch+json", []byte(`{"status":{"phase":"Running"}}`)},
		{"PATCH", podStatus, "application/json-patch+json", []byte(`[{"op":"replace","path":"/status/phase","value":"Failed"}]`)},
		{"PATCH", "/api/v1/namespaces/ns/pods/gone/status", smp, []byte(`{"status":{"phase":"Running"}}`)},
		{"PATCH", nodeStatus + "?fieldManager=kubelet", smp, []byte(`{"status":{"conditions":[{"type":"Ready","status":"False"}]}}`)},
		{"PUT", podStatus, "application/json", bytes.Replace(pod, []byte("Pending"), []byte("Running"), 1)},
		{"PUT", nodeStatus, "", node},
		{"PUT", "/api/v1/namespaces/ns/pods/new/status", "application/json", []byte(`{"metadata":{"name":"new","namespace":"ns"},"status":{}}`)},
		{"PUT", podStatus, "application/yaml", []byte("metadata:\n  name: p\nstatus:\n  phase: Running\n")},
		{"PUT", leasePath, "application/json", lease},
		{"PATCH", podStatus, "application/apply-patch+yaml", []byte(`{}`)},
	} {
		f.Add(s.method, s.target, s.ct, s.body, false)
		f.Add(s.method, s.target, s.ct, s.body, true)
	}
	store, err := cache.Open(filepath.Join(f.TempDir(), cache.FileName), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { store.Close() })
	seed := func(t *testing.T) {
		for _, s := range []struct {
			raw []byte
			gvr schema.GroupVersionResource
		}{{pod, podsGVR}, {node, nodesGVR}, {lease, leasesGVR}} {
			o, err := localapi.DecodeObject(s.raw, "", "")
			if err != nil {
				t.Fatal(err)
			}
			// The cloud's version replaces what was answered locally.
			if err := store.Put("kubelet", s.gvr, o); err != nil {
				t.Fatal(err)
			}
		}
		if err := store.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	proxies := map[bool]*Proxy{}
	for _, healthy := range []bool{false, true} {
		p, err := New(Options{Upstream: deadUpstream{healthy}, Store: store, NodeName: "edge-1", Components: DefaultComponents})
		if err != nil {
			f.Fatal(err)
		}
		proxies[healthy] = p
	}
	f.Fuzz(func(t *testing.T, method, target, ct string, body []byte, healthy bool) {
		if !strings.HasPrefix(target, "/") {
			return
		}
		r, err := http.NewRequest(method, "http://edge"+target, bytes.NewReader(body))
		if err != nil {
			return // not a request line the server reads
		}
		p := proxies[healthy]
		req := p.classify(r)
		if req.kind != kindStatus && req.kind != kindLease {
			return // FuzzParseRequest's ground; reads and watches do not write
		}
		seed(t)
		r.Header.Set("User-Agent", kubeletUA)
		r.Header.Set("Content-Type", ct)
		before, err := store.Get("kubelet", req.GVR, req.Namespace, req.Name)
		if err != nil {
			t.Fatal(err)
		}
		statsBefore := store.Stats()
		queued := p.queue.Len()

		w := httptest.NewRecorder()
		p.ServeHTTP(w, r)
		if err := store.Sync(); err != nil {
			t.Fatal(err)
		}
		after, err := store.Get("kubelet", req.GVR, req.Namespace, req.Name)
		if err != nil {
			t.Fatal(err)
		}
		var qs []cache.QueuedWrite
		for q, err := range store.QueuedWrites(0) {
			if err != nil {
				t.Fatal(err)
			}
			qs = append(qs, q)
		}
		for _, q := range qs { // the next input starts from an empty queue
			if err := p.queue.(*writequeue.Queue).Dequeue(q, cache.OutcomeObsolete); err != nil {
				t.Fatal(err)
			}
		}
		if got := store.Stats()["kubelet"]; got != statsBefore["kubelet"]+map[bool]int{false: 1, true: 0}[before != nil || w.Code != 200] {
			t.Fatalf("%s %s answered %d: the cache holds %d objects, %d before", method, target, w.Code, got, statsBefore["kubelet"])
		}

		if w.Code != http.StatusOK {
			switch w.Code {
			case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusServiceUnavailable:
			default:
				t.Fatalf("%s %s answered %d: %s", method, target, w.Code, w.Body)
			}
			if len(qs) != queued {
				t.Fatalf("%s %s answered %d and queued a write", method, target, w.Code)
			}
			if !sameCached(before, after) {
				t.Fatalf("%s %s answered %d and changed the cache: %s, then %s", method, target, w.Code, raw(before), raw(after))
			}
			return
		}
		out, err := localapi.DecodeObject(w.Body.Bytes(), "", "")
		if err != nil {
			t.Fatalf("%s %s answered 200 with %s: %v", method, target, w.Body, err)
		}
		if out.Name != req.Name || out.Namespace != req.Namespace {
			t.Fatalf("%s %s answered 200 with %s/%s", method, target, out.Namespace, out.Name)
		}
		if before != nil && out.RV <= before.RV {
			t.Fatalf("%s %s answered resourceVersion %d, the cache had %d", method, target, out.RV, before.RV)
		}
		if after == nil || !bytes.Equal(after.Raw, w.Body.Bytes()) {
			t.Fatalf("%s %s answered %s, the cache holds %s", method, target, w.Body, raw(after))
		}
		if req.kind == kindLease {
			if len(qs) != queued {
				t.Fatalf("a Lease renewal was queued")
			}
			return
		}
		if len(qs) != queued+1 {
			t.Fatalf("%s %s answered 200; %d writes queued, want %d", method, target, len(qs), queued+1)
		}
		q := qs[len(qs)-1]
		if q.Method != method || q.Path != r.URL.Path || q.RawQuery != r.URL.RawQuery || q.Name != req.Name ||
			q.Namespace != req.Namespace || q.Resource != req.GVR.Resource || q.Component != "kubelet" {
			t.Fatalf("%s %s queued as %+v", method, target, q)
		}
		if req.Verb == localapi.VerbPatch && (!bytes.Equal(q.Body, body) || q.ContentType != ct) {
			t.Fatalf("patch queued as %q (%s), sent %q (%s)", q.Body, q.ContentType, body, ct)
		}
		if req.Verb == localapi.VerbUpdate && q.ContentType != "application/json" {
			t.Fatalf("update queued as %s", q.ContentType)
		}
		if before != nil && q.UID != before.UID {
			t.Fatalf("queued with UID %q, the cache has %q", q.UID, before.UID)
		}
		var m map[string]json.RawMessage
		if json.Unmarshal(q.Body, &m) != nil && req.Verb == localapi.VerbUpdate {
			t.Fatalf("update queued with a body that is not JSON: %q", q.Body)
		}
	})
}

func sameCached(a, b *localapi.Object) bool {
	return (a == nil) == (b == nil) && (a == nil || bytes.Equal(a.Raw, b.Raw))
}

func raw(o *localapi.Object) []byte {
	if o == nil {
		return []byte("nothing")
	}
	return o.Raw
}
